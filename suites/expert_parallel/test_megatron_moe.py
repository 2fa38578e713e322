"""megatron-core's MoE layer (``MoELayer``: its router, its alltoall and allgather token dispatchers,
``SequentialMLP`` experts, shared experts) against one device, part by part — on a CPU through the named
device redirect (harness/adapters/megatron/cpu.py), in float32: its router's weight is float32 whatever the
dtype and its routing softmax computes in float32, so a float64 comparison could not pass for no bug.

Its load-balancing loss is its own (harness/adapters/megatron/moe.py): the Switch form over each rank's own
tokens, its gradient injected by Megatron in backward. So every part is held to one device computing that
loss per rank and summing — the output, the loss each rank logs, the input gradient, the router's, every
expert's and the shared expert's gradient — within harness/expert_parallel/case.py's bound; a watch holds that
it is not the contract's (the group's tokens). Both dispatchers run every case, so they are held to each other
too (Megatron-LM #1327: the allgather and alltoall dispatchers trained to different results); the skewed
router sends every token to EP rank 0, so rank 1 receives none (#1877: the alltoall dispatcher crashed there).
Its sigmoid router (DeepSeek-V3's, with its expert bias loaded from the layer's selection bias) runs top-2 and top-1.
A watch says megatron-core still needs CUDA without the redirect.
"""

from __future__ import annotations

import pytest

from harness.expert_parallel.case import Case, as_dict
from harness.records import registry
from harness.records.registry import ImplSpec
from harness.runtime.capabilities import says_no_cuda
from suites._support.worlds import gloo_only

MEGATRON = registry.skip_reason(ImplSpec("megatron-moe", "expert_parallel", "x:y", requires=("megatron.core",)))
pytestmark = pytest.mark.skipif(bool(MEGATRON), reason=f"megatron-core: {MEGATRON}")

CASES = [  # (ranks, case, in every profile: the skewed case with both dispatchers, the other with alltoall)
    (2, Case(top_k=2), False),                              # top-2 over ep 2
    (2, Case(top_k=1, renormalize=False, skew=True), True),  # every token to EP rank 0: rank 1 gets none
    (2, Case(top_k=2, shared=1), True),                     # a shared expert, every token's
    (2, Case(top_k=2, renormalize=False), False),           # its pre-softmax top-k (no renormalisation)
    (3, Case(experts=6, top_k=2), False),                   # ep 3
    (4, Case(top_k=2, ep=2), False),                        # two expert-data-parallel replicas
    (2, Case(experts=2, top_k=2, tokens=1), False),         # E = ep, one token per rank
    (2, Case(experts=8, scoring="sigmoid"), True),          # its sigmoid router with the selection bias
    (2, Case(top_k=1, scoring="sigmoid", renormalize=False), False),  # sigmoid top-1 (no renormalisation)
]


@pytest.mark.parametrize("n, case, dispatcher", [
    pytest.param(n, c, d, id=f"{c.label()}-{d}", marks=[] if every and (d == "alltoall" or c.skew) else
                 [pytest.mark.thorough]) for n, c, every in CASES for d in ("alltoall", "allgather")])
def test_megatron_moe_equals_one_device_under_its_own_aux(n, case, dispatcher, world_cache, conformance):
    from harness.expert_parallel.third_party import megatron_moe_report

    per_rank = world_cache.get(n).run(megatron_moe_report, as_dict(case), dispatcher, timeout=180)
    problems = [p for r in per_rank for p in r["problems"]]
    worst = max(v for r in per_rank for k, v in r["parts"].items() if k != "aux vs the contract's")
    conformance.record("fail" if problems else "pass", suite="expert_parallel", world_size=n, dtype="float32",
                       impl=f"megatron-moe-{dispatcher}", collective=f"megatron-aux/{case.label()}", max_rel_err=worst,
                       detail=" | ".join(problems[:1]))
    assert not problems, problems[:4]
    # watch: its loss is over each rank's own tokens, not the group's (where k < E: at k = E every expert holds
    # 1 / E of the assignments on any token set, and both losses are 1)
    away = max(r["parts"]["aux vs the contract's"] for r in per_rank)
    assert away > 100 * per_rank[0]["bound"] or case.top_k == case.experts, away


def test_what_the_megatron_moe_adapter_does_not_drive_is_unsupported():
    from harness.adapters.megatron.moe import MegatronMoE
    from harness.contracts import Unsupported
    from reference.models.moe import MoE

    for dense, needle in [(MoE(8, 8, 4, 2, scoring="sigmoid", renormalize=False), "exactly when top-k > 1"),
                          (MoE(8, 8, 4, 1, scoring="sigmoid", renormalize=True), "exactly when top-k > 1"),
                          (MoE(8, 8, 4, 1, renormalize=True), "top-1 only after the softmax")]:
        with pytest.raises(Unsupported, match=needle) as err:
            MegatronMoE().shard(dense, None, 2)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="alltoall or allgather"):
        MegatronMoE("flex")


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
def test_watch_megatron_moe_layer_needs_cuda_without_the_redirect(dispatcher, world_cache):
    """Watch: outside ``megatron_cpu.on_cpu()`` megatron-core 0.16's MoELayer does not run on a CPU — the alltoall
    dispatcher creates a CUDA stream when it first builds one (token_dispatcher.py:445; later ones reuse it), the
    router moves its weight to the current CUDA device on its first forward (router.py:90). Fails once it runs
    (then the redirect can go)."""
    from harness.expert_parallel.third_party import megatron_moe_probe

    gloo_only(world_cache.get(2), "a watch of the CPU path; on a GPU node megatron's MoELayer runs as it is")
    got = world_cache.get(2).run(megatron_moe_probe, dispatcher, timeout=120)
    # torch's CUDA build on a machine without a driver raises AcceleratorError (a RuntimeError) there
    assert all(r[0] in ("RuntimeError", "AcceleratorError", "AssertionError") and "transformer/moe/" in r[1]
               and says_no_cuda(r[1])
               for r in got), got


def test_watch_megatrons_router_needs_transformer_engine():
    """Watch (the finding): without TransformerEngine megatron-core's ``moe_utils`` leaves ``te_general_gemm``
    undefined while its router gating reads it on every forward. Fails once the name is defined where TE is
    missing (then the adapter's definition can go). Where TE is installed the router runs as it is: skipped.
    Fixed in 0.17 (its range)."""
    import importlib

    from harness.records.findings import outside_range

    why = outside_range("suites/expert_parallel/test_megatron_moe.py::"
                        "test_watch_megatrons_router_needs_transformer_engine")
    if why:
        pytest.skip(why)

    from megatron.core.transformer.moe import moe_utils

    if moe_utils.HAVE_TE:
        pytest.skip("TransformerEngine is installed: the router reads its te_general_gemm")
    fresh = importlib.reload(moe_utils)  # as imported, before the adapter defined the name
    assert not hasattr(fresh, "te_general_gemm")
    from pathlib import Path

    assert "te_general_gemm is not None" in Path(fresh.__file__).read_text()
