"""transformers' expert parallelism (5.x, ``DistributedConfig(ep_size=, fsdp_size=, ep_implementation=
"all_to_all")``) under the World on a CPU with gloo, held to one device (harness/expert_parallel/
transformers_ep.py): a small Qwen3-MoE checkpoint, each rank its rows of the global batch, the loss and every
parameter's gradient — the router's (transformers #48687: under EP the router got the wrong gradient, the loss
right) and every expert's (pytorch #160285's 2x at EP 2) among them — within the stack suite's float32 bound.
ep 2 over 2 ranks, and ep 2 over 4 (two expert-data-parallel replicas: a 2x or a double count shows there).

Optional: transformers and accelerate are not in the cpu env (their install costs the tox budget); the
thorough env installs them (``pip install transformers accelerate`` for a run by hand).
"""

from __future__ import annotations

import importlib.util

import pytest

from harness.releases import not_driven

MISSING = [m for m in ("transformers", "accelerate") if importlib.util.find_spec(m) is None]
WHY = (f"{' and '.join(MISSING)} not installed (pip install transformers accelerate; the thorough env has them)"
       if MISSING else not_driven("transformers"))
pytestmark = pytest.mark.skipif(bool(WHY), reason=str(WHY))


@pytest.mark.parametrize("n, ep", [(2, 2), (4, 2)], ids=["ep2-over-2", "ep2-over-4"])
def test_transformers_expert_parallel_equals_one_device(n, ep, world_cache, conformance, tmp_path):
    from harness.expert_parallel import transformers_ep as case

    case.save_model(str(tmp_path / "qwen3-moe"))
    per_rank = world_cache.get(n).run(case.run_case, str(tmp_path / "qwen3-moe"), ep, timeout=300)
    problems = [p for r in per_rank for p in r["problems"]]
    conformance.record("fail" if problems else "pass", suite="expert_parallel", world_size=n, dtype="float32",
                       impl="transformers", collective=f"qwen3-moe/ep{ep}-fsdp{n}/all_to_all",
                       max_rel_err=max(r["worst"] for r in per_rank), detail=" | ".join(problems[:1]))
    assert not problems, problems[:4]


EXPERTS = ("eager", "batched_mm", "grouped_mm", "deepgemm", "sonicmoe")
"""Every ``experts_implementation`` transformers 5.x offers (its ``ExpertsInterface`` and eager): deepgemm and
sonicmoe are CUDA kernels — unsupported here with their own error."""


@pytest.mark.parametrize("experts", EXPERTS)
def test_every_experts_implementation_under_expert_parallelism_equals_one_device(experts, world_cache, conformance,
                                                                                 tmp_path):
    """ep 2 over 2 ranks, the experts computed by ``experts``, against one device's default."""
    from harness.expert_parallel import transformers_ep as case

    case.save_model(str(tmp_path / "qwen3-moe"))
    per_rank = world_cache.get(2).run(case.run_case, str(tmp_path / "qwen3-moe"), 2, experts, timeout=300)
    unsupported = next((r["unsupported"] for r in per_rank if r["unsupported"]), None)
    problems = [p for r in per_rank for p in r["problems"]]
    outcome = "unsupported" if unsupported else ("fail" if problems else "pass")
    conformance.record(outcome, suite="expert_parallel", world_size=2, dtype="float32", impl="transformers",
                       collective=f"qwen3-moe/ep2-fsdp2/all_to_all/{experts}",
                       max_rel_err=max(r["worst"] for r in per_rank), detail=unsupported or " | ".join(problems[:1]))
    if unsupported:
        assert experts not in ("eager", "grouped_mm"), unsupported  # the CPU's own: they must run here
        pytest.skip(unsupported)
    assert not problems, problems[:4]
