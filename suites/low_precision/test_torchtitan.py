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


def test_the_stack_configures_around_the_finding_and_says_so_where_it_cannot():
    """The torchtitan stack's converter (``recipe_converter``): emulated, its ``torchao_config`` is the rowwise
    recipe's (input, weight and gradient scaled per axis, powers of two) — what its SM89 path builds — and every
    Float8Linear it converts carries it. Where a torchtitan has no such attribute (the fallback: a converter
    without it), the converter is torchtitan's own and the reason comes back — the stack declares the case
    unsupported."""
    why = registry.skip_reason(registry.resolve("torchtitan", "low_precision"))
    if why:
        pytest.skip(why)
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.config import ScalingGranularity

    from harness.adapters.torchtitan import low_precision
    from harness.adapters.torchtitan.trainer import model_config
    from reference.models import ModelSpec

    conv, why = low_precision.recipe_converter("float8-rowwise", emulate=True)
    want = Float8LinearConfig.from_recipe_name("rowwise")
    assert why is None and conv.torchao_config.emulate, why
    assert conv.torchao_config.cast_config_input == want.cast_config_input
    assert conv.torchao_config.cast_config_input.scaling_granularity is ScalingGranularity.AXISWISE
    assert conv.torchao_config.round_scales_to_power_of_2 and want.round_scales_to_power_of_2
    config = conv.convert(model_config(ModelSpec("llama", vocab=13, hidden=32, heads=4, kv_heads=2, ffn=64, layers=2)))
    built = _float8_layers(config)  # each converted layer built as torchtitan builds it: torchao's config on it
    # 6 per block: wq, the fused wkv, wo, w1, w2, w3 (the LM head filtered out)
    assert len(built) == 2 * 6 and all(m.config == conv.torchao_config for m in built), len(built)

    class Bare:  # a converter with no torchao_config: torchtitan's own, and the reason
        def __init__(self, recipe, emulate):
            pass

    original = low_precision.converter
    low_precision.converter = Bare
    try:
        conv, why = low_precision.recipe_converter("float8-rowwise", emulate=True)
    finally:
        low_precision.converter = original
    assert isinstance(conv, Bare) and "tensorwise" in why and "torchao_config" in why, why


def _float8_layers(model_config):
    from torchtitan.components.quantization.float8 import Float8Linear
    from torchtitan.models.common.linear import Linear

    return [Float8Linear(c) for _, c, *_ in model_config.traverse(Linear.Config) if isinstance(c, Float8Linear.Config)]
