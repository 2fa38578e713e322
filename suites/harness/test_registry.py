"""The registry: built-in names, entry points, package.module:object specs, skips with a reason."""

from __future__ import annotations

import importlib.metadata
import sys

import pytest

from harness.records import registry
from harness.records.registry import ImplSpec, RegistryError


def test_builtins_resolve_and_load_as_collectives():
    for name in ("reference", "reference-rhd", "reference-tree", "reference-naive", "torch"):
        impl = registry.resolve(name, "collectives")
        assert impl.name == name and registry.skip_reason(impl) is None
        assert callable(registry.load(name, "collectives").all_to_all)


def test_variants_declare_where_they_differ():
    assert registry.resolve("reference-rhd", "collectives").only_ops == ("all_reduce",)
    assert registry.resolve("reference", "collectives").only_ops == ()


def test_user_spec_loads_a_factory_and_checks_the_contract():
    impl = registry.load("suites.collectives.impls:ring_small_pieces", "collectives")
    assert impl.piece_bytes == 12
    with pytest.raises(RegistryError, match="is not a collectives implementation: it lacks all_gather"):
        registry.load("harness.runtime.world:rank_device", "collectives")
    with pytest.raises(RegistryError, match="a zero-argument factory.*missing 1 required positional argument"):
        registry.load("harness.runtime.timing:summarize", "collectives")


def test_missing_package_is_a_skip_reason_not_a_silent_drop():
    impl = ImplSpec("deepspeed", "collectives", "deepspeed.comm:x", requires=("no_such_package_xyz",))
    assert registry.skip_reason(impl) == (
        "implementation 'deepspeed' needs the package 'no_such_package_xyz', which is not installed")


def test_unknown_paradigm_and_name_are_one_sentence():
    with pytest.raises(RegistryError, match="unknown paradigm 'zero3'"):
        registry.resolve("reference", "zero3")
    with pytest.raises(RegistryError, match=r"known for collectives: reference, .*, torch, or package.module:object"):
        registry.resolve("refrence", "collectives")


def test_entry_point_group_is_discovered(tmp_path, monkeypatch):
    """A distribution that registers an implementation under paritybench.implementations."""
    info = tmp_path / "my_collectives-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-collectives\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[paritybench.implementations]\nmy-ring = suites.collectives.impls:ring_small_pieces\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert "my-ring" in registry.names("collectives")
    impl = registry.resolve("my-ring", "collectives")
    assert impl.target == "suites.collectives.impls:ring_small_pieces" and impl.paradigm == "collectives"
    assert registry.load("my-ring", "collectives").piece_bytes == 12
    assert str(tmp_path) in sys.path


def test_contracts_with_a_method_of_the_same_name_are_told_apart_by_its_arguments():
    """Pipeline and ZeRO each have one method, build: a ZeRO implementation is not run as a pipeline (its
    build cannot take the pipeline's arguments), nor a pipeline as ZeRO."""
    with pytest.raises(RegistryError, match=r"is not a pipeline implementation: it does not take build\(stages, "):
        registry.load("suites.zero.planted:MissingAverage", "pipeline")
    with pytest.raises(RegistryError, match=r"is not a zero implementation: it does not take build\(model, "):
        registry.load("suites.pipeline.impls:AveragesMicrobatches", "zero")
    for spec, paradigm in (("docs.examples.allreduce_data_parallel:AllReduceDataParallel", "zero"),
                           ("docs.examples.gpipe_pipeline:GPipeOnly", "pipeline")):
        assert registry.load(spec, paradigm) is not None


def test_pytest_impl_fitting_no_paradigm_is_told_the_nearest_contracts_refusal(tmp_path, monkeypatch):
    """``pytest --impl`` takes any paradigm's implementation: one that fits none is refused for the paradigm it was
    nearest to — a user's collectives lacking all_to_all is told so (before: the first paradigm's, "lacks wrap"), an
    unknown name is told every registered one (before: checkpointing's alone)."""
    from harness.contracts import CONTRACTS
    from harness.pytest.plugin import _no_paradigm, _refusal

    (tmp_path / "almost_collectives.py").write_text(
        "class AlmostCollectives:\n" + "".join(
            f"    def {op}(self, *args, **kwargs):\n        pass\n"
            for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")))
    monkeypatch.syspath_prepend(str(tmp_path))

    def said(spec: str) -> str:
        refusals = [_refusal(spec, paradigm) for paradigm in CONTRACTS]
        assert all(refusals), spec
        return _no_paradigm(spec, refusals)

    assert said("almost_collectives:AlmostCollectives") == \
        "'almost_collectives:AlmostCollectives' is not a collectives implementation: it lacks all_to_all."
    unknown = said("nccl-magic")
    assert unknown.startswith("unknown implementation 'nccl-magic'; known: reference, torch, ")
    for name in ("reference-rhd", "deepspeed", "reference-ulysses", "torchao"):  # collectives, zero, cp, low precision
        assert f" {name}," in unknown, name
    assert said("no_such_module_xyz:Impl").startswith("cannot import module 'no_such_module_xyz'")
