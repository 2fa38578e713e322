"""What several stack test files share: the model specs of the suite's corners, the padded-batch rotation, the
optimizer a low-precision stack is held with; the verdict itself is ``harness.stack.judge.hold``."""

from __future__ import annotations

import pytest

from harness.stack.judge import hold
from reference.models import ModelSpec
from reference.zero import OptimizerSpec

GPT = ModelSpec("gpt", vocab=13, hidden=16, heads=8, ffn=24, layers=5)
LLAMA = ModelSpec("llama", vocab=13, hidden=16, heads=8, kv_heads=2, ffn=24, layers=5)
MQA = ModelSpec("llama", vocab=13, hidden=16, heads=8, kv_heads=1, ffn=24, layers=5)
LLAMA32 = ModelSpec("llama", vocab=13, hidden=16, heads=8, kv_heads=2, ffn=24, layers=5, dtype="float32")
"""The float32 Llama the third-party stacks train (DeepSpeed, torchtitan: float32 or bf16, not float64)."""
MOE32 = ModelSpec("moe", vocab=13, hidden=16, heads=4, kv_heads=2, ffn=8, layers=3, experts=4, top_k=2, aux_coef=0.1,
                  dtype="float32")
"""DeepSpeed's MoE case: float32 (its gate computes in float32), the balance loss weighted 0.1."""
MOE = ModelSpec("moe", vocab=13, hidden=16, heads=4, kv_heads=2, ffn=8, layers=3, experts=4, top_k=2, aux_coef=0.1)
EVERY_EXPERT = ModelSpec(**{**MOE.as_dict(), "top_k": 4, "ffn": 16, "aux_coef": 0.0, "dtype": "bfloat16"})
"""The MoE case every stack here can train: bf16, every token at every expert, no balance loss, Adam (eps 1e-3:
suites/stack/test_torchtitan.py) — what torchtitan's MoE trains (its experts compute bf16, it has no balance
loss, its optimizers are Adam's; in bf16 a routing choice is not comparable between two implementations:
suites/stack/test_torchtitan_moe.py). ffn 16: torch's grouped GEMM wants 16-byte rows."""

ADAM = OptimizerSpec("adam", 1e-2, eps=1e-3)
"""Adam with eps = 1e-3: its update lr m / (sqrt(v) + eps) divides each gradient element by its own size, so
a float32 rounding difference δg of an element whose gradient is near zero (|g| ~ δg) moves the update by up
to a whole lr step with torch's eps = 1e-8 — a difference the bound (linear in the rounding) does not
cover; with 1e-3 it stays below lr δg / 1e-3. Gradients here are 1e-2 to 1: Adam still normalises them. (The
reference stack, float32, same Adam, on the finding's case: 1.3e-6 — the bound is not what fails there.)"""


ADAM8 = OptimizerSpec("adam", 1e-2)
"""Adam at torch's default eps (1e-8), as the stacks' users run it: in bf16 its masters and second moments are held by
the replay (Adam's step of the stack's own state, harness/stack/adam_replay.py), its first moments by the bound."""


def padded_at(i: int) -> bool:
    """Whether the i-th case of a stack's own case list draws a padded batch: two in three do (their counted
    targets differ per replica, micro-batch and pass; the last micro-batch may hold none), the rest are full."""
    return i % 3 != 2


def held(world_cache, conformance, impl: str, n: int, spec, layout, recipe, **kw) -> dict:
    """``hold``'s verdict of a case every stack meets: skipped (with the stack's sentence) where the stack does not
    provide it, never refused (the layout fits the model), a known finding settled as what it is (a row; xfail, a
    failure under --strict). The caller asserts what must hold of the rest."""
    v = hold(world_cache, conformance, impl, n, spec, layout, recipe, **kw)
    if v["outcome"] == "unsupported":
        pytest.skip(f"{impl} does not provide this case: {v['refused']}")
    assert v["outcome"] != "refused", f"{impl} refused a layout that fits the model: {v['refused']}"
    if v["known"]:
        conformance.settle()
    return v


def named_cases(cases, thorough: set) -> list:
    """``pytest.param`` of each (id, spec, layout, recipe) case, those whose id is in ``thorough`` marked thorough — the
    table idiom of the stack files that split their cases between tox and the thorough env."""
    return [pytest.param(*c[1:], id=c[0], marks=[pytest.mark.thorough] if c[0] in thorough else []) for c in cases]
