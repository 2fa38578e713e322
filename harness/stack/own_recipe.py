"""Stacks whose low-precision recipe is their own: held to their own one-device run, that run held to the
contract's (host side; ``harness.stack.judge.judged`` takes this path for the pairs in ``OWN``).

The precision-matched bound (``harness.stack.precision.allowed_ratio``) is derived for one computation rounded in
different places — the parallel run regrouping one device's sums. A stack that rounds elsewhere even on one
device (torchtitan's MoE: its experts' grouped GEMMs, the combine weights applied in fp32) starts that far from
the contract's recipe before any parallelism; measured 3.4 E_T on one rank, so a layout's own regrouping then
shares the bound with it. Two checks instead, each the one the derivation covers:
  1. the stack on one rank (``Layout()``, the case's global batch) against the contract's one device — within
     ``allowed_ratio`` (one rank) x E_T, as any stack's 1-rank case is held;
  2. the stack on the case's layout against that one-rank run (``harness.stack.mixed``, ``single``) — within
     ``allowed_ratio`` (the layout) x E_T, E_T now the one-rank run's distance from exact arithmetic, which
     check 1 keeps within (1 + its ratio) x the contract's: a wrong one-rank run cannot widen its own bound.
A stack's one-rank run that fails check 1 fails the case (unless the case's layout is refused: that verdict
comes first). The registry is the suite's, not the stack's.
"""

from __future__ import annotations

OWN = {("torchtitan", "moe"): "its grouped experts' bf16 GEMMs and fp32 combine weights (its MoE's own recipe)"}


def own_recipe(impl: str, spec) -> str | None:
    """Why ``impl`` trains ``spec`` in a low-precision recipe of its own (None: the contract's applies)."""
    if spec.dtype not in ("bfloat16", "float16"):
        return None
    return OWN.get((impl, spec.family))


_ONE_RANK: dict = {}


def held(world, one_world, impl: str, spec, layout, recipe, padded: bool = False) -> list[dict]:
    """Every rank's result (``harness.stack.case.train_stack``'s) of check 2, or check 1's on every rank where it
    refused or failed; ``one_world``: a callable giving a World of 1; ``padded``: the case's batch is padded. Each
    result's "own_worst": check 1's."""
    from harness.runtime.world import run_or_fail

    from ..contracts.stack import Layout
    from . import case as ranks

    one = Layout()
    key = (impl, repr(spec), repr(recipe), layout.dp * layout.num_microbatches, ranks.seq_for(layout), padded)
    if key not in _ONE_RANK:
        _ONE_RANK[key] = run_or_fail(one_world(), ranks.train_stack, impl, spec, one, recipe, timeout=300,
                                     failed=ranks.failed, batch_of=layout, keep=True, padded=padded)[0]
    first = _ONE_RANK[key]
    if first["problems"] and layout != one:  # the case's own refusal comes first (E % ep, a layout it lacks)
        per_rank = run_or_fail(world, ranks.train_stack, impl, spec, layout, recipe, timeout=300,
                               failed=ranks.failed, padded=padded)
        if any(r["refused"] for r in per_rank):
            return per_rank
    if first["refused"] or first["problems"] or layout == one:
        own = {**first, "problems": [f"on one rank, against the contract's recipe: {p}" for p in first["problems"]]}
        return [{k: v for k, v in own.items() if k != "states"}] * world.size
    per_rank = run_or_fail(world, ranks.train_stack, impl, spec, layout, recipe, timeout=300, failed=ranks.failed,
                           single=first["states"], padded=padded)
    return [{**r, "own_worst": first["worst"]} for r in per_rank]
