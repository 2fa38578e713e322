"""``harness.stack.casts``: the count of float8 casts a step runs — forward and backward through torch's dispatch mode
(a private module, behind a probe), or the forward alone through its public function mode where the probe fails —
and the floor each recipe sets (no World: the counters on this process)."""

from __future__ import annotations

import torch

from harness.contracts.stack import Layout, Recipe
from harness.stack import casts
from suites.stack.test_low_precision import FP8


class _Cast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.to(torch.float8_e4m3fn)
        return x * 1

    @staticmethod
    def backward(ctx, g):
        g.to(torch.float8_e5m2)
        g.to(torch.float8_e5m2)
        return g * 1


def _count(counter) -> tuple[int, int]:
    x = torch.ones(3, requires_grad=True)
    with counter:
        y = _Cast.apply(x)
        forward = counter.count
        y.sum().backward()
    return forward, counter.count


def test_the_dispatch_counter_sees_the_backward_casts_where_torch_provides_it(monkeypatch):
    monkeypatch.setattr(casts, "_SEES", [])
    cls = casts.counter_class()
    assert cls.sees == "forward and backward" and _count(cls()) == (1, 3)


def test_without_the_private_mode_the_public_counter_sees_the_forward_and_the_floor_follows(monkeypatch):
    """The guard's fallback, driven: the private module gone, torch's public TorchFunctionMode counts the forward's cast
    and not the backward's two — and the floor asks one cast per call, not the recipe's two or four."""
    def gone():
        raise ImportError("no torch.utils._python_dispatch")

    monkeypatch.setattr(casts, "_SEES", [])
    monkeypatch.setattr(casts, "_dispatch_counter_class", gone)
    cls = casts.counter_class()
    assert cls is casts.ForwardCasts and _count(cls()) == (1, 1)
    rowwise = Recipe(low_precision="float8-rowwise")
    both = "forward and backward"
    assert casts.least(FP8, Layout(), rowwise, 2, cls.sees) * 4 == casts.least(FP8, Layout(), rowwise, 2, both)


def test_the_floor_counts_every_call_each_recipe_needs():
    """7 linear layers per Llama block x 3 blocks; 2 steps; tensorwise casts x and g once per call, rowwise twice each;
    a pipeline pass calls each layer once per micro-batch (4 at pp 2), a pass without one at least once."""
    sees = "forward and backward"
    assert casts.linears_per_block(FP8) == 7
    assert casts.least(FP8, Layout(), Recipe(low_precision="float8-tensorwise"), 2, sees) == 7 * 3 * 2 * 2
    assert casts.least(FP8, Layout(), Recipe(low_precision="float8-rowwise"), 2, sees) == 7 * 3 * 4 * 2
    mx = Recipe(low_precision="mxfp8", accumulation=2)
    assert casts.least(FP8, Layout(1, 2, 1), mx, 1, sees) == 7 * 3 * 4 * 4 * 2
    assert casts.least(FP8, Layout(2, 1, 2), Recipe(low_precision="float8-tensorwise"), 1, sees) == 7 * 3 * 2 * 4


def test_a_short_count_is_one_sentence_naming_what_the_recipe_needs():
    rowwise = Recipe(low_precision="float8-rowwise")
    per_rank = [{"float8_casts": 100, "float8_casts_seen": "forward and backward"}, {"float8_casts": 60}]
    line = casts.check(per_rank, FP8, Layout(2, zero=2), rowwise, 2)
    assert line.startswith("float8 casts: 160 over 2 rank(s) in 2 step(s)") and "fewer than the 336" in line, line
    assert "each along two dimensions" in line
    assert casts.check([{"float8_casts": 336, "float8_casts_seen": "forward and backward"}], FP8, Layout(2, zero=2),
                       rowwise, 2) is None
