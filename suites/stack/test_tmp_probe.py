import pytest
from harness.contracts.stack import Layout, Recipe
from harness.stack.judge import hold
from reference.zero import OptimizerSpec
from suites._support.stack import ADAM, LLAMA32, LLAMA


@pytest.mark.parametrize("spec,layout,recipe", [
    (LLAMA32, Layout(1, 1, 2, compile=True), Recipe(optimizer=ADAM)),
    (LLAMA32, Layout(1, 1, 2, compile=True), Recipe()),
    (LLAMA, Layout(1, 1, 2, compile=True), Recipe()),
])
def test_probe(world_cache, conformance, spec, layout, recipe):
    v = hold(world_cache, conformance, "torch", layout.world_size, spec, layout, recipe, localise=False)
    print(spec.dtype, recipe.optimizer.name, v["outcome"], v["per_rank"][0].get("worst"), v["per_rank"][0].get("bound"))
    for p in v["problems"][:8]:
        print("  ", p)
