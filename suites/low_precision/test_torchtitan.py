"""torchtitan's float8 converter through the low-precision contract (``--impl torchtitan``: its cases in
``test_equivalence.py``), and the watch of its finding: emulated, its rowwise recipe trains tensorwise."""

from __future__ import annotations

import pytest

from harness.low_precision.case import Case
from harness.records import findings, registry
from suites._support.layers import judge_low_precision as judge

WATCH = "suites/low_precision/test_torchtitan.py::test_watch_torchtitans_emulated_rowwise_float8_is_tensorwise"


def test_watch_torchtitans_emulated_rowwise_float8_is_tensorwise(world_cache, conformance):
    """Watch (torchtitan 0.3.0): ``Float8LinearConverter(Config(recipe_name="rowwise", emulate=True))`` trains with
    ``Float8LinearConfig(emulate=True)`` — tensorwise — so a one-rank linear layer is off the rowwise recipe by far more
    than fp32 accumulation allows, and the failure is this finding's. Fails once the converter keeps the recipe (the
    config's input scaling rowwise): drop the finding, and torchtitan's rowwise cases pass or fail on their own."""
    why = findings.outside_range(WATCH) or registry.skip_reason(registry.resolve("torchtitan", "low_precision"))
    if why:
        pytest.skip(why)
    from torchao.float8.config import ScalingGranularity

    from harness.adapters.torchtitan.low_precision import converter_config

    config = converter_config("rowwise")
    assert config.cast_config_input.scaling_granularity is ScalingGranularity.TENSORWISE, config
    outcome, _, problems, _ = judge(world_cache, conformance, "torchtitan",
                                    Case(recipe="float8-rowwise", kind="replicated", dp=1, tp=1, n=32, k=32, tokens=32))
    assert outcome == "fail" and findings.match("torchtitan", "low_precision", problems, recipe="float8-rowwise"), \
        problems[:2]
