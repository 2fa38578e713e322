"""The contracts' inputs (``Layout``, ``ModelSpec``, ``OptimizerSpec``, ``Recipe``, the low-precision ``Layout``)
refuse what no trainer can run in one sentence, before any stack is built — not a ZeroDivisionError, and not a value
each stack meets in its own way inside its ranks (which a suite reads as that stack's fail: `localise --clip -1`
localised the reference as failing), nor a field an implementation silently ignores (fsdp "with" sequence
parallelism)."""

from __future__ import annotations

import math

import pytest

from harness.contracts.stack import Layout, Recipe
from reference.low_precision import Layout as LowPrecisionLayout
from reference.models import ModelSpec
from reference.zero import OptimizerSpec

REFUSED = [
    (lambda: ModelSpec("llama", kv_heads=0), "kv_heads must be >= 1; got 0."),  # before: ZeroDivisionError
    (lambda: ModelSpec("llama", heads=4, kv_heads=3),
     "hidden (16) must divide by heads (4) and heads by kv_heads (3)."),
    (lambda: ModelSpec("bert"), "family must be one of gpt, llama, moe; got 'bert'."),
    (lambda: ModelSpec("gpt", dtype="int8"), "dtype must be float64, float32, bfloat16 or float16; got 'int8'."),
    (lambda: ModelSpec("gpt", vocab=0), "vocab must be >= 1; got 0."),
    (lambda: ModelSpec("gpt", heads=4, kv_heads=2),
     "the gpt family has full multi-head attention: kv_heads must be heads (4); got 2."),
    (lambda: ModelSpec("moe", top_k=5), "top_k must be between 1 and experts (4); got 5."),
    (lambda: ModelSpec("moe", router="argmax"), "router must be one of softmax, sigmoid; got 'argmax'."),
    (lambda: ModelSpec("moe", renormalize=1), "renormalize must be True or False; got 1."),
    (lambda: ModelSpec("moe", shared_experts=-1), "shared_experts must be >= 0; got -1."),
    (lambda: ModelSpec("moe", aux_coef=math.nan), "aux_coef must be >= 0; got nan."),  # before: accepted
    (lambda: OptimizerSpec("sgd", 0.1, momentum=-1), "momentum must be >= 0; got -1."),
    (lambda: OptimizerSpec("adam", 0.1, betas=(1.5, 0.9)), "betas must be two numbers in [0, 1); got (1.5, 0.9)."),
    (lambda: OptimizerSpec("adam", 0.1, betas=(0.9,)), "betas must be two numbers in [0, 1); got (0.9,)."),
    (lambda: OptimizerSpec("adam", 0.1, eps=-1e-8), "eps must be >= 0; got -1e-08."),
    (lambda: OptimizerSpec("adam", 0.1, eps=math.nan), "eps must be >= 0; got nan."),
    (lambda: Recipe(optimizer="sgd"), "optimizer must be a reference.zero.OptimizerSpec; got 'sgd'."),
    (lambda: Recipe(growth_interval=0), "growth_interval must be a whole number >= 1; got 0."),
    (lambda: Recipe(accumulation=0), "accumulation must be a whole number >= 1; got 0."),
    (lambda: LowPrecisionLayout("diagonal"), "kind must be one of replicated, column, row, fsdp; got 'diagonal'."),
    (lambda: LowPrecisionLayout("fsdp", sp=True),  # before: accepted, trained as plain fsdp, labelled fsdp-sp
     "sequence parallelism is tensor parallelism's (column, row); the fsdp layout has none."),
    (lambda: LowPrecisionLayout("column", fp8_all_gather=True),
     "the float8 all-gather is FSDP's (the fsdp layout); the column layout gathers no weight."),
    (lambda: Layout(2, replicate=3), "replicate (3) must be a whole number dividing dp x cp (2): the replicas of a "
                                     "hybrid-sharded mesh."),
]


@pytest.mark.parametrize("make, said", REFUSED, ids=[said for _, said in REFUSED])
def test_an_input_no_trainer_can_run_is_one_sentence(make, said):
    with pytest.raises(ValueError) as exc:
        make()
    assert str(exc.value) == said


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan])
def test_a_recipe_refuses_a_clip_or_loss_scale_no_step_can_take(value):
    """A clip at inf is torch's "the norm, nothing clipped" (clip_grad_norm_ takes it): accepted; a loss scale at inf
    makes every step overflow: refused."""
    with pytest.raises(ValueError) as exc:
        Recipe(max_grad_norm=value)
    assert str(exc.value) == (f"max_grad_norm must be a number > 0 (inf: the norm computed, nothing clipped) or None; "
                              f"got {value!r}.")
    for scale in (value, math.inf):
        with pytest.raises(ValueError) as exc:
            Recipe(loss_scale=scale)
        assert str(exc.value) == f"loss_scale must be a finite number > 0 or None; got {scale!r}."
    assert Recipe(max_grad_norm=math.inf).max_grad_norm == math.inf and Recipe(loss_scale=2.0**16, max_grad_norm=0.5)


LAYOUT_FIELDS = [
    (lambda: Layout(2, sequence_parallel=True),  # before: accepted, and a stack ignoring it passed a case labelled SP
     "sequence_parallel shards what tensor parallelism replicates: it needs tp > 1; got tp 1."),
    (lambda: Layout(2, compile="yes"), "compile must be True or False; got 'yes'."),
    (lambda: Layout(2, checkpointing=1), "checkpointing must be True or False; got 1."),
    (lambda: Layout(1, 2, 1, microbatches=0),  # before: 0 read as "unset", 2 pp microbatches ran
     "microbatches must be a whole number >= 1 or None (2 pp); got 0."),
]


@pytest.mark.parametrize("make, said", LAYOUT_FIELDS, ids=[said for _, said in LAYOUT_FIELDS])
def test_a_layout_field_a_stack_could_ignore_is_refused(make, said):
    with pytest.raises(ValueError) as exc:
        make()
    assert str(exc.value) == said


def test_the_ranges_torch_accepts_are_accepted():
    """The bounds are torch.optim's: momentum 0, a beta of 0 and eps 0 are valid there, and here."""
    assert OptimizerSpec("sgd", 0.1, momentum=0).momentum == 0
    assert OptimizerSpec("adam", 0.1, betas=(0.0, 0.0), eps=0.0).eps == 0.0
    assert Recipe(optimizer=OptimizerSpec("adam", 1e-3), growth_interval=1, loss_scale=2.0**16).growth_interval == 1
