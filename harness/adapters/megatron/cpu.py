"""megatron-core on a CPU: the narrowly scoped device redirect its code needs to run under gloo, named here
and in docs/guides/stacks.md. It changes where megatron-core allocates, never what it computes.

megatron-core 0.16 writes its device into its code: ``torch.cuda.current_device()`` for buffers (the DDP
grad buffer, the rotary embedding's ``inv_freq``, the pipeline's p2p shapes, the global memory buffer the
attention core reads), ``device="cuda"`` for scalars (the schedules' token count, the grad norm), CUDA
streams and ``torch.cuda.synchronize()`` around its communication, the CUDA RNG tracker for dropout, and
type strings (``param.grad.type() == 'torch.cuda.FloatTensor'``, ``'torch.cuda.BFloat16Tensor'``) in its
optimizers. ``on_cpu()``, while Megatron's code runs:

- every loaded ``megatron.core`` module's global ``torch`` is a view of torch whose ``cuda`` answers
  ``current_device()`` with the CPU, whose tensor factories put ``device="cuda"`` on the CPU, whose streams
  and synchronisations are no-ops (gloo's collectives are synchronous) and whose CUDA RNG is the CPU
  generator (the tracker forks and restores it; with dropout 0 nothing draws from it);
- its MoE dispatcher's device-to-host copy of the all-to-all split sizes (``moe_utils.maybe_move_tensor_to_cpu``,
  CUDA tensors only) converts a CPU tensor the same way (``as_numpy``: ``.numpy()``), so the splits reach
  ``all_to_all_single`` as the CUDA path hands them over;
- ``Tensor.type()`` (no argument) of a CPU tensor reads the CUDA type's name, so the optimizers' checks of
  the parameter types accept the CPU tensors of the same dtype, and ``Tensor.cuda()`` leaves a tensor where it
  is (the tied embedding's last-stage copy, ``language_module.py``).

Both are undone on exit, so nothing else in the process (megatron's MoE watches, the tensor-parallel
adapter) sees them. On a CUDA machine ``on_cpu()`` does nothing: Megatron runs as it is.
"""

from __future__ import annotations

import contextlib
import sys
import types

import torch

_FACTORIES = ("zeros", "ones", "empty", "tensor", "full", "arange", "zeros_like", "empty_like", "ones_like")


def _cpu(device):
    return "cpu" if device is not None and torch.device(device).type == "cuda" else device


class _NoEvent:
    """A CUDA event on the CPU: every operation is already done."""

    def synchronize(self) -> None:
        pass

    def wait(self, *args, **kwargs) -> None:
        pass

    def record(self, *args, **kwargs) -> None:
        pass

    def query(self) -> bool:
        return True


class _NoStream:
    def wait_stream(self, other) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, *args, **kwargs):
        return _NoEvent()


class _CpuCuda:
    """``torch.cuda`` as megatron-core's modules see it on a CPU."""

    default_generators = (torch.default_generator,)
    random = types.SimpleNamespace(get_rng_state=lambda device=None: torch.get_rng_state())

    def __getattr__(self, name):
        return getattr(torch.cuda, name)

    @staticmethod
    def current_device():
        return torch.device("cpu")

    @staticmethod
    def get_rng_state(*args, **kwargs):
        return torch.get_rng_state()

    @staticmethod
    def manual_seed(seed) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def synchronize(*args, **kwargs) -> None:
        pass

    @staticmethod
    def empty_cache() -> None:
        pass

    @staticmethod
    def Stream(*args, **kwargs):  # noqa: N802 - torch.cuda's name
        return _NoStream()

    @staticmethod
    def Event(*args, **kwargs):  # noqa: N802 - torch.cuda's name
        return _NoEvent()

    @staticmethod
    def stream(stream):
        return contextlib.nullcontext()

    @staticmethod
    def default_stream(*args, **kwargs):
        return _NoStream()

    @staticmethod
    def current_stream(*args, **kwargs):
        return _NoStream()


def _factory(fn):
    def call(*args, device=None, **kwargs):
        return fn(*args, device=_cpu(device), **kwargs)

    return call


class _CpuTorch(types.ModuleType):
    """torch as megatron-core's modules see it on a CPU: everything torch's, but ``cuda`` and the factories."""

    def __init__(self):
        super().__init__("torch")
        self.cuda = _CpuCuda()
        for name in _FACTORIES:
            setattr(self, name, _factory(getattr(torch, name)))

    def __getattr__(self, name):
        return getattr(torch, name)


_REAL_TYPE = torch.Tensor.type


def _cuda_named_type(self, dtype=None, non_blocking=False, **kwargs):
    if dtype is None and not kwargs and self.device.type == "cpu":
        return _REAL_TYPE(self).replace("torch.", "torch.cuda.", 1)
    return _REAL_TYPE(self, dtype, non_blocking, **kwargs)


_REAL_CUDA = torch.Tensor.cuda


def _stays_on_cpu(self, *args, **kwargs):
    return self


def _to_host(tensor, as_numpy: bool = False, record_stream: bool = False):
    """``maybe_move_tensor_to_cpu`` of a tensor already on the CPU: what its CUDA branch returns."""
    return tensor.numpy() if as_numpy and torch.is_tensor(tensor) else tensor


_VIEW = _CpuTorch()
_DEPTH = [0]


@contextlib.contextmanager
def on_cpu():
    """megatron-core's code runs on the CPU inside (re-entrant; nothing on a CUDA machine)."""
    if torch.cuda.is_available() or _DEPTH[0]:
        _DEPTH[0] += 1
        try:
            yield
        finally:
            _DEPTH[0] -= 1
        return
    import megatron.core.dist_checkpointing.strategies.state_dict_saver  # noqa: F401 - what the stack drives,
    import megatron.core.dist_checkpointing.strategies.torch  # noqa: F401 - loaded before the swap
    import megatron.core.distributed  # noqa: F401
    import megatron.core.models.gpt  # noqa: F401
    import megatron.core.optimizer  # noqa: F401
    import megatron.core.pipeline_parallel  # noqa: F401
    import megatron.core.transformer.moe.token_dispatcher  # noqa: F401

    megatron = [m for name, m in list(sys.modules.items()) if name.startswith("megatron.core") and m is not None]
    swapped = [m for m in megatron if getattr(m, "torch", None) is torch]
    for module in swapped:
        module.torch = _VIEW
    hosts = [(m, m.maybe_move_tensor_to_cpu) for m in megatron if hasattr(m, "maybe_move_tensor_to_cpu")]
    for module, _ in hosts:
        module.maybe_move_tensor_to_cpu = _to_host
    torch.Tensor.type, torch.Tensor.cuda = _cuda_named_type, _stays_on_cpu
    _DEPTH[0] += 1
    try:
        yield
    finally:
        _DEPTH[0] -= 1
        torch.Tensor.type, torch.Tensor.cuda = _REAL_TYPE, _REAL_CUDA
        for module in swapped:
            module.torch = torch
        for module, held in hosts:
            module.maybe_move_tensor_to_cpu = held
