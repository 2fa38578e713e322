"""Importing torchtitan (0.3.x) on a machine without CUDA: the two narrowly scoped patches the torchtitan
stack applies, and only where they are needed (docs/guides/stacks.md names them).

1. ``torchtitan.models.llama3`` imports the MoE token dispatchers, one of which (MinimalAsyncEP, symmetric
   memory on CUDA) imports ``triton`` at module level — 1 GB installed, and a CUDA compiler. Without
   triton, its kernels module (``torchtitan.distributed.minimal_async_ep.kernels``) is replaced by one whose
   eight kernels raise "needs triton" when called: the Llama model and its parallelize code never call
   them. triton itself is never stubbed (torch asks whether it is importable).
2. ``torchtitan.tools.utils.device_type`` falls back to "cuda" when no accelerator is found, and its
   ``device_module`` to ``torch.cuda``; ``ParallelDims`` builds its device mesh on that type. Without an
   accelerator both are set to the CPU's ("cpu", ``torch.cpu``) — in ``torchtitan.tools.utils`` and in every
   torchtitan module that had already bound them by name.
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
    raise RuntimeError("torchtitan's MinimalAsyncEP kernels need triton (CUDA); this machine has none.")


def import_torchtitan():
    """``torchtitan.models.llama3``, with the patches above applied where this machine needs them."""
    if importlib.util.find_spec("triton") is None and KERNELS not in sys.modules:
        stub = types.ModuleType(KERNELS)
        stub.__doc__ = "paritybench: torchtitan's MinimalAsyncEP kernels without triton (they raise when called)."
        for name in _KERNEL_NAMES:
            setattr(stub, name, _needs_triton)
        sys.modules[KERNELS] = stub
    importlib.import_module("torchtitan.tools.utils")
    _device_to_cpu()  # before the rest is imported: every later "from ... import device_type" binds "cpu"
    return importlib.import_module("torchtitan.models.llama3")


def _device_to_cpu() -> None:
    import torch

    if torch.cuda.is_available():
        return
    for name, module in list(sys.modules.items()):
        if name.startswith("torchtitan") and getattr(module, "device_type", None) == "cuda":
            module.device_type = "cpu"
            if getattr(module, "device_module", None) is torch.cuda:
                module.device_module = torch.cpu
