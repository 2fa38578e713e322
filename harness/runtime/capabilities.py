"""What this machine can compute, asked of the machine itself (or of the package that decides), so that a
case it cannot run is ``unsupported`` with the device's own reason — never a failure, never an xfail.

Machines differ: a CPU without fp16 GEMM kernels (``torch.ops.mkldnn._is_mkldnn_fp16_supported()`` is
False on some AMD EPYC parts), where DeepSpeed's engine refuses fp16 outright (*"Type fp16 is not
supported on your device."*); a torch build whose CPU lacks a dtype's kernels. Each check answers None
(the machine can) or one sentence (why not). ``denied`` makes a check answer "no" on any machine, so that
a test can prove the unsupported path wherever it runs (it is set on the rank that asks).
"""

from __future__ import annotations

import contextlib
from functools import cache

import torch

_DENIED: dict[str, str] = {}
"""capability -> the reason a test made it answer: tests only (``denied``)."""


@contextlib.contextmanager
def denied(capability: str, reason: str = "denied by a test"):
    """Within the block, ``capability`` ("deepspeed-float16", "float16", ...) answers unsupported."""
    _DENIED[capability] = reason
    try:
        yield
    finally:
        _DENIED.pop(capability, None)


def deny_on_rank(capability: str, fn, *args, **kwargs):
    """Rank side (``World.run(deny_on_rank, capability, fn, ...)``): ``fn(*args, **kwargs)`` with the
    capability denied on this rank."""
    with denied(capability):
        return fn(*args, **kwargs)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@cache
def _probe(dtype: torch.dtype, device: str) -> str | None:
    """A small matmul, its backward and an MSE loss in ``dtype`` on ``device``: the error it raises, or None."""
    try:
        a = torch.ones(3, 3, dtype=dtype, device=device, requires_grad=True)
        torch.nn.functional.mse_loss(a @ a, torch.zeros(3, 3, dtype=dtype, device=device)).backward()
    except (RuntimeError, NotImplementedError) as exc:
        return _said(exc)
    return None


def _said(exc: Exception) -> str:
    """'RuntimeError: <the error's first line>' (an error with no message: its type alone, and the colon)."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


def dtype_unsupported(dtype: torch.dtype, device: torch.device | str = "cpu") -> str | None:
    """None where ``device`` trains in ``dtype`` (matmul, backward, a loss); else why not, in one sentence."""
    name = _name(dtype)
    if name in _DENIED:
        return f"this device cannot compute in {name} ({_DENIED[name]})."
    error = _probe(dtype, str(torch.device(device).type))
    return None if error is None else f"this {torch.device(device).type} cannot compute in {name}: {error}."


def deepspeed_dtype_unsupported(dtype: torch.dtype) -> str | None:
    """None where DeepSpeed's accelerator says it runs ``dtype`` (float16 / bfloat16); else its own reason —
    the check its engine makes before it refuses (``_do_sanity_check``: "Type fp16 is not supported on your
    device.")."""
    name = _name(dtype)
    key = f"deepspeed-{name}"
    if dtype not in (torch.float16, torch.bfloat16):
        return None
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    short = "fp16" if dtype == torch.float16 else "bf16"
    if key in _DENIED:
        why = _DENIED[key]
    else:
        supported = accelerator.is_fp16_supported() if dtype == torch.float16 else accelerator.is_bf16_supported()
        if supported:
            return None
        why = f"is_{short}_supported() is False"
        if accelerator.device_name() == "cpu" and dtype == torch.float16:
            why += " because torch.ops.mkldnn._is_mkldnn_fp16_supported() is False: this CPU has no fp16 GEMM kernels"
    return (f"DeepSpeed's {accelerator.device_name()} accelerator does not run {name} here ({why}); its engine "
            f"refuses it: 'Type {short} is not supported on your device.'")


@cache
def pinned_memory_unsupported() -> str | None:
    """None where this machine pins host memory (page-locked, for copies to and from an accelerator: what an offload
    policy that pins asks for); else why not, in one sentence — torch's own error (no accelerator on a CPU host)."""
    try:
        torch.empty(1).pin_memory()
    except RuntimeError as exc:
        return f"this machine cannot pin host memory: {_said(exc).rstrip('.')}."
    return None


def rank_dtype_unsupported(name: str) -> str | None:
    """Rank side: ``dtype_unsupported`` on this rank's own device."""
    from harness.runtime.rank import rank_device

    return dtype_unsupported(getattr(torch, name), rank_device())


def require_dtype(world, name: str, conformance=None, **row) -> None:
    """Driver side, in a test: skip it — recorded ``unsupported`` with the reason where ``conformance`` is
    given — unless every rank of ``world`` computes in dtype ``name``."""
    import pytest

    reason = next(filter(None, world.run(rank_dtype_unsupported, name, timeout=120)), None)
    if reason:
        if conformance is not None:
            conformance.record("unsupported", world_size=world.size, dtype=name, detail=reason, **row)
        pytest.skip(f"unsupported on this machine: {reason}")


NO_CUDA = ("Torch not compiled with CUDA enabled", "requires CUDA support", "Found no NVIDIA driver",
           "no CUDA GPUs are available", "CUDA driver initialization failed", "CUDA driver version is insufficient")
"""How torch says a CUDA call cannot run here: the CPU build's wording, then the CUDA build's on a machine without a
driver or device (what `pip install torch` gives a user on a CPU machine)."""


def says_no_cuda(text: str) -> bool:
    """Whether an error's text is torch refusing a CUDA call on this machine (either build's wording)."""
    return any(phrase in text for phrase in NO_CUDA)
