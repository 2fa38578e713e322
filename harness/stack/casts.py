"""Counting the float8 casts a stack's step runs: a stack asked for a float8 / MX recipe that computes its linear
layers in high precision agrees with one device within the precision-matched bound (its error is smaller, not
larger), so the bound alone cannot see it — nor a recipe of fewer scales (tensorwise where rowwise was asked).

``counter()`` counts every op, in the forward **and the backward**, that returns a float8 tensor (the cast of an
operand, as torchao and ours cast) on this rank, with a ``TorchDispatchMode`` — torch's
``torch.utils._python_dispatch``, a private module: used behind a guard. The guard probes once per process that the
mode sees a cast inside an autograd backward; where the import fails or the probe counts otherwise, the counter is
torch's public ``TorchFunctionMode``, which sees the forward's casts only (``SEES``: "forward and backward" or
"forward"), and the floor is the forward's.

``least(spec, layout, recipe, steps, sees)`` is the fewest casts all ranks together run: each linear layer of each
block is called once per micro-batch of a pipeline pass with pp > 1 (a stage runs each micro-batch) and at least once
per pass otherwise, on each replica and each tensor- / context-parallel rank; each call casts at least its two
activations, the input x and the upstream gradient g (a weight's cast may serve several calls) — once each for
tensorwise, twice each where each GEMM scales along its own reduction dimension (rowwise, MX: x along K and along
the tokens, g along N and along the tokens). Seen from the forward only, a call casts at least its input."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

FLOAT8 = {torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz}
_SEES: list = []


def _is_float8(out) -> bool:
    return isinstance(out, torch.Tensor) and out.dtype in FLOAT8


class ForwardCasts(TorchFunctionMode):
    """The public fallback: torch-function calls returning float8 (an autograd backward is not seen)."""

    sees = "forward"

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.count += _is_float8(out)
        return out


def _dispatch_counter_class():
    from torch.utils._python_dispatch import TorchDispatchMode

    class AllCasts(TorchDispatchMode):
        sees = "forward and backward"

        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.count += _is_float8(out)
            return out

    return AllCasts


class _Probe(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.to(torch.float8_e4m3fn)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        g.to(torch.float8_e5m2)
        return g * 2


def _probe(cls) -> bool:
    """Whether a counter of ``cls`` sees one cast in a forward and one in its backward."""
    x = torch.ones(2, requires_grad=True)
    with cls() as c:
        _Probe.apply(x).sum().backward()
    return c.count == 2


def counter_class():
    """The counter this process uses (probed once): the dispatch mode where it sees the backward, else the public
    function mode."""
    if not _SEES:
        try:
            cls = _dispatch_counter_class()
            ok = _probe(cls)
        except Exception:  # noqa: BLE001 - the private module moved or behaves otherwise: torch's public mode
            ok = False
        _SEES.append(cls if ok else ForwardCasts)
    return _SEES[0]


def counter():
    return counter_class()()


def linears_per_block(spec) -> int:
    from reference.low_precision.convert import block_linears

    return len(block_linears(spec.build(0))) // spec.layers


def casts_per_call(recipe_name: str, sees: str) -> int:
    from reference.low_precision import recipe

    if sees == "forward":
        return 1
    return 2 if recipe(recipe_name).cast("output", "x").granularity == "tensor" else 4


def least(spec, layout, recipe, steps: int, sees: str) -> int:
    calls_per_pass = layout.num_microbatches if layout.pp > 1 else 1
    return (linears_per_block(spec) * spec.layers * casts_per_call(recipe.low_precision, sees) * calls_per_pass
            * recipe.accumulation * steps * layout.dp * layout.cp * layout.tp)


def check(per_rank: list, spec, layout, recipe, steps: int) -> str | None:
    """The problem line when the ranks' casts (each rank's result's ``float8_casts`` and ``float8_casts_seen``) fall
    short of ``least``."""
    got = sum(int(r.get("float8_casts", 0)) for r in per_rank if isinstance(r, dict))
    sees = next((r["float8_casts_seen"] for r in per_rank if isinstance(r, dict) and "float8_casts_seen" in r),
                "forward")
    need = least(spec, layout, recipe, steps, sees)
    if got >= need:
        return None
    per_call = casts_per_call(recipe.low_precision, sees)
    what = {1: "its input", 2: "its input and its gradient", 4: "its input and its gradient, each along two "
            "dimensions"}[per_call]
    return (f"float8 casts: {got} over {len(per_rank)} rank(s) in {steps} step(s) (seen in the {sees}), fewer than "
            f"the {need} that {linears_per_block(spec)} linear layers x {spec.layers} blocks under "
            f"{recipe.low_precision} need (each call casts {what}): linear layers computed in high precision, or "
            f"under a recipe of fewer scales")
