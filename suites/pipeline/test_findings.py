"""Third-party behaviour this suite found, kept under watch (harness/pipeline/__init__.py lists them).

torch.distributed.pipelining (torch 2.13, gloo) raises on unequal microbatches — a batch of 7 in 2
microbatches: "The size of tensor a (4) must match the size of tensor b (3)" — while the contract
splits with tensor_split like torch.tensor_split does. The ``torch`` pipeline adapter reports such
cases as unsupported. When torch handles them this test fails: then drop the adapter's Unsupported.
"""

from __future__ import annotations

import pytest

from harness.pipeline.case import PipelineCase, compare, run_rank, single_device
from harness.records import findings
from harness.runtime.world import RankFailure

from .ranks import torch_uneven_microbatches


def test_torch_pipelining_still_raises_on_unequal_microbatches(world_cache, world_sizes):
    if 2 not in world_sizes:
        pytest.skip("needs a 2-rank world")
    with pytest.raises(RankFailure) as info:
        world_cache.get(2).run(torch_uneven_microbatches, 7, 2, timeout=60)
    assert "must match the size of tensor b (3)" in str(info.value)


def test_torch_split_backward_double_counts_a_weight_used_twice(world_cache, world_sizes):
    """torch 2.12's split backward (pytorch #180952): the last stage applies one Linear twice; ZBV's W counts its
    gradient twice. The minimal case: p=2, m=2, equal microbatches. Fixed in 2.13 (this test then skips)."""
    if 2 not in world_sizes:
        pytest.skip("needs a 2-rank world")
    why = findings.outside_range("suites/pipeline/test_findings.py::test_torch_split_backward_double_counts_a_"
                                 "weight_used_twice")
    if why:
        pytest.skip(why)
    case = PipelineCase("torch", "zbv", 2, 2, 2, batch=4, hidden=2, layers_per_stage=2, seed=1, shared="stage")
    verdict = compare(case, single_device(case), world_cache.get(2).run(run_rank, case, timeout=60))
    assert verdict["outcome"] == "fail" and "step-1 gradient of parameter" in verdict["detail"], verdict
    assert findings.match("torch", "pipeline", verdict["problems"], schedule="zbv", shared="stage"), verdict
    unshared = PipelineCase("torch", "zbv", 2, 2, 2, batch=4, hidden=2, layers_per_stage=2, seed=1)
    assert compare(unshared, single_device(unshared), world_cache.get(2).run(run_rank, unshared))["outcome"] == "pass"
