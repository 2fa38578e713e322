"""Where and why, end to end: planted bugs in the reference stack and in two third-party stacks (torch's, and
torchtitan's where it is installed), each started from a larger case than it needs, each localised by the suite's
own verdict (``hold``): the right minimal configuration, the right first diverging tensor, the right shape — all
three asserted. A passing case is never localised (nothing traced, no extra World call)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from harness.contracts.stack import Layout, Recipe
from harness.stack.judge import hold
from suites._support.stack import ADAM, GPT, LLAMA, LLAMA32, MOE, MQA

SHAPES, PLANTED = "suites.stack.planted_shapes:", "suites.stack.planted:"
TITAN = pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None, reason="torchtitan is not installed")
CLIP = Recipe(max_grad_norm=0.05)
ACC_CLIP = Recipe(max_grad_norm=0.05, accumulation=2)

CASES = [
    # (planted, spec, start layout, recipe, minimal (dp, pp, tp, cp, ep), minimal accumulation, first phase, first
    #  tensor (a part of its name), shape rule, shape needle)
    pytest.param(SHAPES + "TpGradientsSummed", GPT, Layout(2, 1, 2), ACC_CLIP, (1, 1, 2, 1, 1), 1,
                 "reduced gradient", "ln_f.weight", "factor", "= the size of tp: an extra sum over the tp group",
                 id="reference-missing-tp-average"),
    pytest.param(PLANTED + "KVReplicasNotSummed", MQA, Layout(2, 1, 2), ACC_CLIP, (1, 1, 2, 1, 1), 1,
                 "local gradient", "blocks.4.attn.", "partial", "missing sum over tp", id="reference-kv-replicas"),
    pytest.param(SHAPES + "CPLocalRotary", LLAMA, Layout(2, 1, 1, cp=2), CLIP, (1, 1, 1, 2, 1), 1,
                 "forward", "blocks.0.attn", "offset", "local positions", id="reference-rotary-offset-per-cp-chunk"),
    pytest.param(PLANTED + "MoEExpertsDividedByEDP", MOE, Layout(2, 1, 1, ep=2), CLIP, (2, 1, 1, 1, 2), 1,
                 "reduced gradient", ".experts.", "factor", "= the size of ep", id="reference-expert-gradient-x-ep"),
    pytest.param(SHAPES + "DroppedRemainderRow", GPT, Layout(2, 1, 2), Recipe(accumulation=2), (1, 1, 2, 1, 1), 1,
                 "forward", "embed", "zeroed", "token 12", id="reference-dropped-remainder-row"),
    pytest.param(SHAPES + "Fc1ShardsSwapped", GPT, Layout(2, 1, 2), CLIP, (1, 1, 2, 1, 1), 1, "forward",
                 "blocks.0.fc1", "permuted", "rank 0 holds rank 1's, rank 1 holds rank 0's",
                 id="reference-shard-order"),
    pytest.param(SHAPES + "MeanTimesCount", GPT, Layout(2, 2, 1), CLIP, (1, 2, 1, 1, 1), 1, "loss", "the loss",
                 "nonfinite", "NaN / inf", id="reference-nan-on-an-empty-micro-batch"),
    pytest.param(PLANTED + "MeanPerMicroBatch", GPT, Layout(2, 2, 1), CLIP, (1, 1, 1, 1, 1), 1, "backward", "ln_f",
                 "per-part", "its own factor", id="reference-mean-per-micro-batch"),
    pytest.param(SHAPES + "ReducedOnTheRootOnly", GPT, Layout(2, 1, 2), CLIP, (1, 1, 2, 1, 1), 1, "forward",
                 "blocks.0.attn", "one-rank", "right on rank 0 only, wrong on 1: they differ in their tp coordinate",
                 id="reference-reduced-on-the-root-only"),
    pytest.param(SHAPES + "UpdateAscends", GPT, Layout(1, 2, 1), CLIP, (1, 1, 1, 1, 1), 1, "update", "",
                 "sign", "a sign flip", id="reference-update-sign"),
    pytest.param(SHAPES + "TorchLossNotDividedByAccumulation", GPT, Layout(2, 1, 1, zero=2), ACC_CLIP,
                 (1, 1, 1, 1, 1), 2, "backward", "head", "factor", "= the number of accumulation steps",
                 id="torch-loss-per-pass"),
    pytest.param(SHAPES + "TitanNormsSummedOverTp", LLAMA32, Layout(2, 1, 2), Recipe(optimizer=ADAM,
                 max_grad_norm=0.05), (1, 1, 2, 1, 1), 1, "reduced gradient", "ln_f.weight", "factor",
                 "= the size of tp", id="torchtitan-missing-tp-average",
                 marks=[TITAN, pytest.mark.thorough]),  # 9 s; its rule, "factor", is reference-missing-tp-average's
]


@pytest.mark.parametrize("impl, spec, layout, recipe, dims, accumulation, phase, tensor, rule, needle", CASES)
def test_a_planted_bug_is_shrunk_traced_and_its_shape_named(impl, spec, layout, recipe, dims, accumulation, phase,
                                                            tensor, rule, needle, world_cache, conformance):
    padded = impl.endswith(("MeanPerMicroBatch", "MeanTimesCount"))  # what shows only when counts differ
    v = hold(world_cache, conformance, impl, layout.world_size, spec, layout, recipe, padded=padded)
    assert v["outcome"] == "fail", (v["outcome"], v["refused"])
    loc = v["localised"]
    m = loc.shrunk.minimal
    lay = m.layout
    assert (lay.dp, lay.pp, lay.tp, lay.cp, lay.ep) == dims and m.recipe.accumulation == accumulation, loc.lines()
    assert m.steps == 1 and m.recipe.max_grad_norm is None, loc.lines()  # neither is what these bugs need
    assert loc.shrunk.calls <= 24, loc.shrunk.calls
    assert loc.first is not None and loc.first.phase == phase and tensor in loc.first.name, loc.lines()
    assert loc.shape[0] == rule and needle in loc.shape[1], loc.lines()
    assert v["problems"][:3] == loc.lines()[:3] and v["problems"][0].startswith("Fails at"), v["problems"][:3]


class _Run:
    def __init__(self, path):
        self.path, self.rows = path, []

    def append(self, name, row):
        self.rows.append((name, row))


def test_a_fail_is_written_to_the_run_folder_and_a_stack_without_modules_is_localised_on_its_parameters(
        world_cache, tmp_path):
    from harness.pytest.plugin import Conformance

    conformance = Conformance(_Run(tmp_path), "the-property")
    v = hold(world_cache, conformance, SHAPES + "TpGradientsSummedUntraced", 4, GPT, Layout(2, 1, 2), CLIP)
    loc = v["localised"]
    assert any("exposes no modules" in line for line in loc.lines()), loc.lines()
    assert loc.first.phase == "reduced gradient" and loc.first.name == "ln_f.weight", loc.lines()
    assert loc.shape[0] == "factor" and "the size of tp" in loc.shape[1], loc.lines()
    (saved,) = (tmp_path / "localised").glob("*.json")
    record = json.loads(saved.read_text())
    assert record["lines"] == loc.lines() and record["first"]["name"] == "ln_f.weight" and record["curve"]
    assert saved.with_suffix(".png").stat().st_size > 0
    from harness.localise.saved import section

    report = section(tmp_path)  # what the report's conformance section adds
    assert f"- {loc.lines()[0]}" in report and any(line.endswith(f"{saved.with_suffix('.png').name})")
                                                   for line in report), report
    (name, row), = conformance.run.rows
    assert name == "conformance.csv" and row["outcome"] == "fail" and row["detail"].startswith("Fails at"), row


def test_a_passing_case_is_never_localised(world_cache, conformance, monkeypatch):
    import harness.localise

    def never(*args, **kwargs):
        raise AssertionError("a passing case was localised")
    monkeypatch.setattr(harness.localise, "localise", never)
    v = hold(world_cache, conformance, "reference", 2, GPT, Layout(1, 1, 2), CLIP)
    assert v["outcome"] == "pass" and "localised" not in v, v["problems"][:3]


def _installed(name):
    return pytest.mark.skipif(importlib.util.find_spec(name) is None, reason=f"{name} is not installed")


PASSING = [
    pytest.param("reference", LLAMA, Layout(1, 2, 2, checkpointing=True), ACC_CLIP, id="reference-1x2x2-ckpt"),
    pytest.param("reference", GPT, Layout(2, 1, 2, zero=2), ACC_CLIP, id="reference-2x1x2-zero2"),
    pytest.param("reference", LLAMA, Layout(2, 2, 2, checkpointing=True), ACC_CLIP, id="reference-2x2x2-ckpt",
                 marks=pytest.mark.thorough),
    pytest.param("reference", LLAMA, Layout(1, 1, 2, cp=2), CLIP, id="reference-tp2-cp2", marks=pytest.mark.thorough),
    pytest.param("torch", GPT, Layout(2, 1, 2, zero=2), CLIP, id="torch-2x1x2",
                 marks=pytest.mark.thorough),  # 8.7 s; the torch stack is traced in tox by torch-loss-per-pass
    pytest.param("torchtitan", LLAMA32, Layout(1, 1, 2), Recipe(optimizer=ADAM), id="torchtitan-1x1x2", marks=TITAN),
    pytest.param("accelerate", LLAMA32, Layout(2, 1, 1), Recipe(), id="accelerate-2x1x1",
                 marks=_installed("accelerate")),
    pytest.param("deepspeed", LLAMA32, Layout(2, 1, 1, zero=1), Recipe(optimizer=ADAM), id="deepspeed-2x1x1",
                 marks=_installed("deepspeed")),
]


@pytest.mark.parametrize("impl, spec, layout, recipe", PASSING)
def test_a_passing_case_traced_blames_no_tensor(impl, spec, layout, recipe, world_cache):
    """What the localisation compares on a case that passes: hundreds of tensors mapped onto one device's, none off
    its bound (a bound that blamed rounding, or a shard mapped onto the wrong slice, would show here). Stacks without
    traced_modules (accelerate's, DeepSpeed's) have theirs found by their parameters' names."""
    from harness.localise import Case, trace_only

    loc = trace_only(world_cache.get, impl, Case(spec, layout, recipe, steps=2))
    assert loc.first is None, loc.lines()
    phases = {label.split(":")[1] for label, _, _ in loc.curve}
    assert {"forward", "backward", "reduced gradient", "update", "loss"} <= phases, phases
    assert len(loc.curve) > 200, len(loc.curve)
    if impl in ("accelerate", "deepspeed"):
        assert any("found by their parameters' names" in n for n in loc.notes), loc.notes


@pytest.mark.parametrize("argv, said", [
    (["--layout", "2x1"], "--layout '2x1' must be dpxppxtp"),
    (["--layout", "1x1x1", "--steps", "0"], "--steps must be >= 1"),
    (["--layout", "2x1x1", "--ep", "3"], "ep (3) must divide dp x cp (2)"),
    (["--layout", "1x1x1", "--accumulation", "0"], "accumulation must be a whole number >= 1"),
    (["--weight-decay", "0.1"], "--weight-decay is AdamW's (--optimizer adamw); sgd takes none."),
    (["--optimizer", "adamw", "--weight-decay", "-1"], "weight_decay must be >= 0; got -1.0."),
    (["--lr-schedule", "warmup=x"], "--lr-schedule's warmup must be a whole number; got 'x'."),
    (["--lr-schedule", "peak=2"], "--lr-schedule takes key=value pairs of warmup, start, stable, decay, total"),
    (["--lr-schedule", "decay=cosine"], "a cosine decay needs total"),
    (["--clip", "-1"], "--clip must be a norm > 0; got -1.0."),  # before: a fail, localised (the stack raised)
    (["--clip", "nan"], "--clip must be a norm > 0; got nan."),
])
def test_paritybench_localise_says_a_bad_input_in_one_sentence_with_exit_code_2(argv, said, capsys):
    from harness.cli.main import main

    assert main(["localise", "reference", *argv]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err


@pytest.mark.thorough  # ~3 s of its own Worlds' spawns; CI's thorough step runs it
def test_paritybench_localise_of_a_case_that_holds_says_pass_and_exits_0(tmp_path, capsys):
    """Nothing to localise: the verdict in one line, exit 0, and nothing written to --out."""
    from harness.cli.main import main

    assert main(["localise", "reference", "--layout", "1x1x1", "--steps", "1", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "pass: the case holds to one device\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.thorough  # tox's budget (7.5 s): the localisation itself runs in tox in-process (the tests above)
def test_paritybench_localise_prints_the_verdict_and_writes_its_plot(tmp_path, capsys):
    from harness.cli.main import main

    assert main(["localise", SHAPES + "TpGradientsSummed", "--layout", "1x1x2", "--steps", "1",
                 "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Fails at tp 2, one step — no smaller case fails") and "passes with tp 1" in out[0], out
    assert out[2].startswith("Shape: an exact factor 2 = the size of tp"), out
    assert len(list((tmp_path / "localised").glob("*.png"))) == 1


@pytest.mark.thorough  # ~3 s; the decay shape runs in tox alone (test_localise_rules.py)
def test_paritybench_localise_names_adamws_decay_of_the_spared_parameters(capsys):
    from harness.cli.main import main

    assert main(["localise", "suites.stack.planted:DecaysEveryParameter", "--layout", "2x1x1", "--steps", "1",
                 "--optimizer", "adamw"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[2].startswith("Shape: an update off by exactly -lr x weight_decay x the parameter (0.001)"), out


def test_a_localisation_that_breaks_leaves_the_verdict_standing(world_cache, conformance, monkeypatch):
    import harness.localise

    def broken(*args, **kwargs):
        raise RuntimeError("the localisation's own bug")
    monkeypatch.setattr(harness.localise, "localise", broken)
    v = hold(world_cache, conformance, SHAPES + "UpdateAscends", 1, GPT, Layout(), Recipe(), steps=1)
    assert v["outcome"] == "fail" and "localised" not in v, v["outcome"]
    assert v["problems"][0] == "(not localised: RuntimeError: the localisation's own bug)", v["problems"][:2]
    assert any("parameter" in p for p in v["problems"][1:]), v["problems"][:3]

