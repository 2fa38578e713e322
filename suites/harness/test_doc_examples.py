"""The example implementations of docs/examples/ (the "test your own implementation" guide) go through
each paradigm's oracle exactly as a user's implementation arrives (a package.module:object spec loaded
in the ranks): what they implement passes, what they leave out is reported unsupported, what they
refuse is refused."""

from __future__ import annotations

import pytest
import torch

from harness.checkpoint import case as checkpoint_case
from harness.collectives.case import COLLECTIVES, Case
from harness.pipeline.case import PipelineCase, compare, run_rank, single_device
from harness.records import registry
from harness.tensor_parallel import case as tp_case
from harness.zero import case as zero_case

from ..collectives.property import verdict

pytestmark = pytest.mark.checkout  # reads the clone's files or runs its tools

EXAMPLES = {"collectives": "docs.examples.gather_collectives:GatherCollectives",
            "pipeline": "docs.examples.gpipe_pipeline:GPipeOnly",
            "tensor_parallel": "docs.examples.column_row_tensor_parallel:ColumnRowOnly",
            "zero": "docs.examples.allreduce_data_parallel:AllReduceDataParallel",
            "checkpoint": "docs.examples.per_layer_checkpointing:PerLayerCheckpointing",
            "stack": "docs.examples.ddp_stack:DDPStack"}


@pytest.mark.parametrize("paradigm", sorted(EXAMPLES))
def test_example_satisfies_its_contract(paradigm):
    assert registry.check(EXAMPLES[paradigm], paradigm).name == EXAMPLES[paradigm]


def test_collectives_example(world_cache, world_sizes):
    spec = EXAMPLES["collectives"]
    for n in sorted({s for s in world_sizes if s == 3} | {max(world_sizes)}):
        for collective in COLLECTIVES:
            for dtype, op, numel in (("float32", "sum", 7), ("float16", "avg", 1), ("int32", "max", 0),
                                     ("bfloat16", "min", 3)):
                case = Case(spec, collective, dtype, numel, op, root=n - 1, in_place=numel == 7, seed=n)
                got = verdict(world_cache, n, case)
                assert got["outcome"] == "pass", f"{case.line(n)}: {got['detail']}"
        for case in (Case(spec, "all_reduce", "float32", 5, "product"), Case(spec, "reduce", "int64", 2, "avg")):
            assert verdict(world_cache, n, case)["outcome"] == "unsupported", case.line(n)


def test_pipeline_example(world_cache, world_sizes):
    spec = EXAMPLES["pipeline"]
    for p in [s for s in world_sizes if s <= 3]:
        for m, batch in ((1, 3), (p + 1, 2 * p + 3), (5, 4)):  # m < p, batch % m != 0, an empty microbatch
            case = PipelineCase(spec, "gpipe", p, m, batch=batch, hidden=3, layers_per_stage=2, seed=m)
            got = compare(case, single_device(case), world_cache.get(p).run(run_rank, case))
            assert got["outcome"] == "pass", f"{case.line()}: {got['detail']}"
    case = PipelineCase(spec, "1f1b", max(world_sizes), 2)
    got = compare(case, single_device(case), world_cache.get(case.p).run(run_rank, case))
    assert got["outcome"] == "unsupported" and "gpipe" in got["detail"]


def test_tensor_parallel_example(world_cache, world_sizes):
    spec = EXAMPLES["tensor_parallel"]
    for n in world_sizes:
        world = world_cache.get(n)
        for kind in ("column", "row"):
            for r in world.run(tp_case.contract_case, spec, kind, (3, 2, 2 * n, 3 * n), n, False):
                assert r["refused"] is None and not r["problems"], (kind, n, r)
            if n > 1:  # features that do not divide by n: refused in one sentence, not wrong
                r = world.run(tp_case.contract_case, spec, kind, (3, 2, 2 * n + 1, 3 * n + 1), n, False)[0]
                assert r["refused"] and not r["unsupported"], r
        r = world.run(tp_case.contract_case, spec, "mlp", (3, 2, 4 * n, 8 * n), n, False)[0]
        assert r["unsupported"], r


def test_zero_example(world_cache, world_sizes):
    spec = EXAMPLES["zero"]
    for n in world_sizes:
        for model, opt in (("mlp", "sgd"), ("block", "adam")):
            r = world_cache.get(n).run(zero_case.train_case, spec, 0, model, opt, 2, 2, n)[0]
            assert not r["refused"] and not r["problems"], (n, model, opt, r["problems"])
        assert world_cache.get(n).run(zero_case.train_case, spec, 1, "mlp", "sgd", 1, 2, n)[0]["unsupported"]


def test_stack_example(world_cache, world_sizes):
    """The DDP stack: every data-parallel layout, both families, with clipping and accumulation, equals one
    device; a pipeline layout is unsupported, in one sentence."""
    from harness.contracts.stack import Layout, Recipe
    from harness.stack import case as stack_case
    from reference.models import ModelSpec

    spec = EXAMPLES["stack"]
    models = (ModelSpec("gpt", heads=4, layers=2, tie_embeddings=True), ModelSpec("llama", kv_heads=1, layers=2))
    for n in world_sizes:
        for model in models:
            for recipe, padded in ((Recipe(max_grad_norm=0.05), False), (Recipe(accumulation=2), True)):
                r = world_cache.get(n).run(stack_case.train_stack, spec, model, Layout(dp=n), recipe,
                                           padded=padded)[0]
                assert not r["refused"] and not r["problems"], (n, model.family, recipe, r["problems"][:3])
    r = world_cache.get(2).run(stack_case.train_stack, spec, models[0], Layout(pp=2), Recipe())[0]
    assert r["unsupported"] and "\n" not in r["refused"], r


def test_checkpoint_example():
    impl = registry.load(EXAMPLES["checkpoint"], "checkpoint")
    for count, dropout in ((1, 0.0), (4, 0.3)):
        assert not checkpoint_case.compare(impl, "layer", count, 5, dropout, torch.float64, True, count)
    with pytest.raises(NotImplementedError, match="sqrt"):
        checkpoint_case.compare(impl, "sqrt", 3, 5, 0.3, torch.float64, True, 0)
