"""gloo moves float8 tensors as bytes: an all-gather (``all_gather_single`` / ``all_gather_into_tensor``) of float8
tensors on a gloo group runs on their uint8 views.

gloo has no float8 type ("Invalid scalar type", torch 2.13), so FSDP2's float8 all-gather (torchao's
``enable_fsdp_float8_all_gather``) cannot run on a CPU. An all-gather moves bytes and computes nothing: on the views it
delivers exactly what nccl delivers. Reductions of float8 have no byte-wise meaning and are left failing, as are
collectives torch issues from C++ (DTensor's functional collectives: torchao's float8 all-gather of activations).

``install()`` wraps the two public functions of ``torch.distributed`` once per process (idempotent); every call that is
not a float8 all-gather on gloo goes to torch's own function unchanged. ``ORIGINAL`` keeps torch's functions (what
the machine itself can do: ``float8_collective_error`` probes with them)."""

from __future__ import annotations

import torch

ORIGINAL: dict = {}
_FLOAT8 = {torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz}


def _on_gloo(group) -> bool:
    import torch.distributed as dist

    return dist.get_backend(group) == "gloo"


def _as_bytes(fn):
    def all_gather(output_tensor, input_tensor, group=None, async_op=False):
        if output_tensor.dtype in _FLOAT8 and input_tensor.dtype == output_tensor.dtype and _on_gloo(group):
            return fn(output_tensor.view(torch.uint8), input_tensor.view(torch.uint8), group=group, async_op=async_op)
        return fn(output_tensor, input_tensor, group=group, async_op=async_op)
    all_gather.__wrapped__ = fn
    return all_gather


def install() -> None:
    import torch.distributed as dist

    for name in ("all_gather_single", "all_gather_into_tensor"):
        fn = getattr(dist, name, None)
        if fn is not None and name not in ORIGINAL:
            ORIGINAL[name] = fn
            setattr(dist, name, _as_bytes(fn))
