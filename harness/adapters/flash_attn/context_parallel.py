"""ring-flash-attn (zhuzilin/ring-flash-attention: ``ring_flash_attn_func``, ``zigzag_ring_flash_attn_func``)
and yunchang (feifeibear/long-context-attention: ``LongContextAttention``, hybrid Ulysses x ring) under the
context-parallel contract — registered so that a run names them and says why they do not run.

Both call flash-attn's kernels, which take float16 / bfloat16 on CUDA only. The context-parallel property is
float64 (``harness/context_parallel/case.py``: a bound derived from the blockwise merge in float64), so
every case is ``unsupported`` with that sentence — on CPU the registry skips them before (the packages are
not installed without CUDA). What running them for real needs: a precision-matched property (one device
running flash-attn's own kernel in bf16 on the whole sequence, the error held in units of its distance from
float64, as ``suites/mixed_precision`` holds ZeRO) — the GPU guide lists it."""

from __future__ import annotations

from harness.contracts import Unsupported

PACKAGES = {"ring-flash-attn": "ring_flash_attn", "yunchang": "yunchang"}


class FlashContextParallel:
    def __init__(self, package: str = "ring-flash-attn"):
        if package not in PACKAGES:
            raise ValueError(f"package must be one of {', '.join(PACKAGES)}; got {package!r}.")
        self.package = package
        self.description = f"{package} (flash-attn kernels: float16 / bfloat16 on CUDA only)"

    def shard(self, dense, group, layout: str):
        dtype = next(dense.parameters()).dtype
        raise Unsupported(f"{self.package} runs flash-attn's float16 / bfloat16 CUDA kernels; this case is "
                          f"{str(dtype).removeprefix('torch.')}, and no precision-matched context-parallel property "
                          "exists here yet.")

    def full_grads(self, sharded, group) -> dict:
        raise Unsupported(f"{self.package} built no module here.")
