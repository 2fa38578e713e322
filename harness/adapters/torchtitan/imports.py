"""Importing torchtitan (0.3.x) on a machine without CUDA: the two narrowly scoped patches the torchtitan
stack applies, and only where they are needed (docs/guides/stacks.md names them).

1. ``torchtitan.models.llama3`` imports the MoE token dispatchers, one of which (MinimalAsyncEP, symmetric
   memory on CUDA) imports ``triton`` at module level — 1 GB installed, and a CUDA compiler. Without
   triton, its kernels module (``torchtitan.distributed.minimal_async_ep.kernels``) is replaced by one whose
   eight kernels raise "needs triton" when called: the Llama model and its parallelize code never call
   them. triton itself is never stubbed (torch asks whether it is importable). 0.2.x imports its MoE's
   permutation kernels (``torchtitan.models.moe.kernels``) from the package's ``__init__``: stubbed alike.
2. ``torchtitan.tools.utils.device_type`` falls back to "cuda" when no accelerator is found, and its
   ``device_module`` to ``torch.cuda``; ``ParallelDims`` builds its device mesh on that type. Where the World's
   ranks compute on the CPU (gloo: ``harness.runtime.rank.rank_device``, on a machine with or without CUDA) both
   are set to the CPU's ("cpu", ``torch.cpu``) — in ``torchtitan.tools.utils`` and in every torchtitan module that
   had already bound them by name; on nccl torchtitan keeps its own.
"""

from __future__ import annotations

import importlib.util
import sys
import types

KERNELS = "torchtitan.distributed.minimal_async_ep.kernels"
_KERNEL_NAMES = ("copy_full_counts_to_peers_kernel", "copy_rows_to_peers_kernel", "expand_topk_grad_kernel",
                 "fill_combine_metadata_kernel", "fill_dispatch_metadata_kernel", "invert_flat_indices_kernel",
                 "reduce_topk_slots_kernel", "topk_scores_grad_kernel")


def _needs_triton(*args, **kwargs):
    raise RuntimeError("torchtitan's triton kernels need triton (CUDA); this machine has none.")


KERNELS_V02 = "torchtitan.models.moe.kernels"
"""0.2.x's: its MoE's token permutation kernels, imported by the package's own ``__init__`` (through its float8
converter's MoE import) — the Llama never calls them."""
_KERNEL_NAMES_V02 = ("generate_permute_indices", "fill_indices_wrapper")


def _stub(module: str, names) -> None:
    if module not in sys.modules:
        stub = types.ModuleType(module)
        stub.__doc__ = "paritybench: torchtitan's triton kernels on a machine without triton (they raise when called)."
        for name in names:
            setattr(stub, name, _needs_triton)
        sys.modules[module] = stub


def import_torchtitan():
    """``torchtitan.models.llama3``, with the patches above applied where this machine needs them."""
    if importlib.util.find_spec("triton") is None:
        _stub(*((KERNELS_V02, _KERNEL_NAMES_V02) if v02() else (KERNELS, _KERNEL_NAMES)))
    importlib.import_module("torchtitan.tools.utils")
    _device_to_cpu()  # before the rest is imported: every later "from ... import device_type" binds "cpu"
    return importlib.import_module("torchtitan.models.llama3")


def _device_to_cpu() -> None:
    import torch

    from harness.runtime.rank import rank_device

    if rank_device().type != "cpu":  # a World on nccl: torchtitan's own CUDA device, as its users run it
        return
    for name, module in list(sys.modules.items()):
        if name.startswith("torchtitan") and getattr(module, "device_type", None) == "cuda":
            module.device_type = "cpu"
            if getattr(module, "device_module", None) is torch.cuda:
                module.device_module = torch.cpu


def v02() -> bool:
    """Whether the installed torchtitan is a 0.2.x (``torchtitan_v02.py`` drives it)."""
    from harness.records.versions import installed

    return (installed("torchtitan") or "").startswith("0.2.")
