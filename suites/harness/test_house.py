"""The house's mechanisms, each on its own: a paradigm declared once (its record read by the CLI, the report and
the registries), one verdict (the exception ladder, the reduction), what a stack supports (declared rules, in
order), the dense-state precedence, and the moved modules' old names."""

from __future__ import annotations

import importlib
import math
import sys

import pytest

from harness import paradigm, verdict
from harness.contracts import Unsupported
from harness.paradigm import Bench, Paradigm, Section


def test_every_record_resolves_and_no_name_is_declared_twice():
    records = paradigm.paradigms()
    assert len({p.name for p in records}) == len(records)
    assert set(paradigm.contracts()) == {"checkpoint", "collectives", "context_parallel", "expert_parallel",
                                         "low_precision", "muon", "pipeline", "stack", "tensor_parallel", "zero"}
    benches = [b for p in records for b in p.benches]
    assert len({b.name for b in benches}) == len(benches)
    for b in benches:
        assert callable(paradigm.load(b.plans)) and (b.arguments is None or callable(paradigm.load(b.arguments)))
    for s in paradigm.sections():
        assert callable(paradigm.load(s.function)), s
    for p in records:
        assert all(spec.paradigm == p.name for spec in (*p.builtins, *p.third_party)), p.name
        assert all(f.paradigm == p.name for f in p.findings), p.name


def _plugin_sweep(cfg, get_world, run):
    run.append("benchmarks.csv", {"suite": "plugin", "impl": "mine", "op": "x", "world_size": 1, "status": "ok"})


def _plugin_plans(args):
    return [("plugin", type("Cfg", (), {"__dataclass_fields__": {}})(), _plugin_sweep)]


def _plugin_arguments(p):
    p.add_argument("--plugin-knob", default="7")


def _plugin_section(rows, run_dir, md):
    return ["## The plug-in's section", "", f"{len(rows)} row(s)", ""]


PLUGIN = Paradigm("plugin", 99, benches=(Bench("plugin", "a plug-in's sweep", f"{__name__}:_plugin_plans",
                                               f"{__name__}:_plugin_arguments"),),
                  sections=(Section(500, f"{__name__}:_plugin_section", suite="plugin"),))


@pytest.fixture
def with_plugin(monkeypatch):
    """A paradigm from outside the package, through the entry-point group: nothing shared is edited."""
    class EntryPoint:
        name = "plugin"

        @staticmethod
        def load():
            return PLUGIN

    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **kw: [EntryPoint] if kw.get("group") == paradigm.ENTRY_POINT_GROUP else real(**kw))
    paradigm.paradigms.cache_clear()
    yield
    paradigm.paradigms.cache_clear()


def test_a_declared_paradigm_reaches_the_cli_and_the_report(with_plugin, tmp_path):
    from harness.cli.main import _build_parser
    from harness.cli.report import write_report
    from harness.records.results import RunDir

    args = _build_parser().parse_args(["bench", "plugin", "--plugin-knob", "3"])
    assert args.suite == "plugin" and args.plugin_knob == "3"
    run = RunDir(str(tmp_path), {"suite": "plugin"})
    _plugin_sweep(None, None, run)
    run.finish("complete")
    text = write_report(run.path).read_text()
    assert "## The plug-in's section" in text and "1 row(s)" in text


def test_a_paradigm_declared_twice_is_said(with_plugin, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "PLUGIN", Paradigm("zero", 1))  # the entry point's: a second "zero"
    paradigm.paradigms.cache_clear()
    with pytest.raises(ValueError, match=r"^paradigm\(s\) zero declared more than once\.$"):
        paradigm.paradigms()


def test_a_plugin_that_declares_no_paradigm_is_one_sentence_and_exit_2(with_plugin, monkeypatch, capsys):
    from harness.cli.main import main

    monkeypatch.setattr(sys.modules[__name__], "PLUGIN", object())
    paradigm.paradigms.cache_clear()
    assert main(["impls"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("entry point 'plugin' of paritybench.paradigms is not a harness.paradigm.Paradigm.") and \
        "\n" not in err, err


class _Declines:
    def __init__(self, exc):
        self.exc = exc

    def __call__(self, *args):
        raise self.exc


def test_the_ladder_from_an_exception_to_a_verdict(monkeypatch):
    told = []
    monkeypatch.setattr(verdict, "failed_in_implementation", told.append)
    assert verdict.attempt("build", lambda a, b: a + b, 1, 2) == (3, None)
    _, v = verdict.attempt("build", _Declines(Unsupported("no ZeRO 3.")))
    assert (v["refused"], v["unsupported"], v["problems"]) == ("no ZeRO 3.", True, [])
    _, v = verdict.attempt("build", _Declines(ValueError("tp must divide 8.")), x=1)
    assert (v["refused"], v["unsupported"], v["x"]) == ("tp must divide 8.", False, 1)
    _, v = verdict.attempt("build", _Declines(ValueError("bad")), refusals=(), rank=3)
    assert v["refused"] is None and v["problems"] == ["rank 3: build raised ValueError: bad"] and v["worst"] == math.inf
    assert told == ["rank 3: build raised ValueError: bad"]  # the World is told at once: peers are ended


def test_the_reduction_of_every_ranks_result():
    ok, bad = verdict.checked([], 1e-15, 1e-12), verdict.checked(["rank 1: loss off"], 0.5, 1e-12)
    assert verdict.reduce([ok, ok]) == ("pass", None, [])
    assert verdict.reduce([ok, bad, bad]) == ("fail", None, ["rank 1: loss off"])
    refused = verdict.refusal("no.", unsupported=True)
    assert verdict.reduce([bad, refused]) == ("unsupported", "no.", ["rank 1: loss off"])
    assert verdict.reduce([ok, verdict.refusal("odd.")]).outcome == "refused"
    assert verdict.worst([ok, bad]) == 0.5 and verdict.reduce([ok, bad]).detail == "rank 1: loss off"


def test_a_stacks_supports_are_its_rules_in_order():
    from harness.contracts.stack import Layout, Recipe
    from harness.stack.supports import Rule, Supports
    from reference.models import ModelSpec

    spec = ModelSpec("gpt", vocab=13, hidden=16, heads=8, ffn=24, layers=5)
    supports = Supports("the toy stack", unsupported=(
        Rule(lambda s, lay, r: lay.cp > 1, "no cp."),
        Rule(lambda s, lay, r: True, lambda s, lay, r: None),  # asks another module: no objection
        Rule(lambda s, lay, r: lay.zero == 3, lambda s, lay, r: f"no ZeRO {lay.zero}.")),
        refused=(Rule(lambda s, lay, r: s.heads % lay.tp, "tp must divide 8."),))
    supports.check(spec, Layout(1, 1, 2), Recipe())
    with pytest.raises(Unsupported, match=r"^no ZeRO 3\.$"):
        supports.check(spec, Layout(2, 1, 3, zero=3), Recipe())  # unsupported before refused
    with pytest.raises(ValueError, match=r"^tp must divide 8\.$"):
        supports.check(spec, Layout(1, 1, 3), Recipe())
    assert supports.why_unsupported(ModelSpec(**{**spec.as_dict(), "extra": {"novel": 1}}), Layout(cp=2), Recipe()) == \
        "the toy stack does not know novel."


def test_the_dense_state_precedence():
    from harness.stack.dense import merged, tied

    everyone = [{"a": 0, "b": 0}, {"a": 1, "c": 1}, {"c": 2, "d": 2}]
    assert merged(everyone, 1) == {"a": 1, "c": 1, "b": 0, "d": 2}  # its own, then the lowest other rank's
    embed = object()
    params, optimizer = {"embed.weight": embed}, {"embed.weight": {"m": 1}, "head.weight": {"m": 1}}
    tied(params, optimizer)
    assert params["head.weight"] is embed and optimizer == {"embed.weight": {"m": 1}}
    params, optimizer = {"embed.weight": 1, "head.weight": 2}, {"embed.weight": {}, "head.weight": {}}
    tied(params, optimizer)  # the tie broke: each reported as it is
    assert params == {"embed.weight": 1, "head.weight": 2} and set(optimizer) == {"embed.weight", "head.weight"}


@pytest.mark.parametrize("old, new", [("harness.world", "harness.runtime.world"),
                                      ("harness.registry", "harness.records.registry"),
                                      ("harness.calibrate.sweep", "harness.cost_model.sweep"),
                                      ("reference.compose", "reference.stack.compose"),
                                      ("reference.state.threed", "reference.resume.threed")])
def test_a_moved_module_keeps_its_old_name(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)


def test_an_old_implementation_spec_is_the_built_in_option_it_was():
    from harness.records import findings, registry

    old = "harness.adapters.deepspeed_stack:CallerScalesLoss"
    assert registry.resolve(old, "stack").target == "harness.adapters.deepspeed.stack:CallerScalesLoss"
    assert findings._builtin(old, "stack") == "deepspeed"
