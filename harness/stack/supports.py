"""What a stack trains, declared once: the cases it does not provide and the sizes it cannot split, each with the
one sentence the verdict shows.

An adapter declares ``SUPPORTS = Supports("the torch stack", unsupported=(...), refused=(...))`` — each rule a
``Rule(when, why)`` of the case (``spec, layout, recipe``): ``why`` a sentence, or a function of the case giving
one (None: no objection after all, for a rule that asks another module). Its ``build`` calls
``SUPPORTS.check(spec, layout, recipe)`` first: the first unsupported rule that holds raises ``Unsupported``
(outcome ``unsupported``: not the stack's), else the first refused rule raises ``ValueError`` (``refused``: a size
the stack cannot split, which the contract lets it refuse). A spec or layout field the stack does not know is
unsupported before any rule. The coverage check (suites/stack/test_coverage.py) reads the same declaration.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ..contracts import Unsupported


class Rule(NamedTuple):
    when: Callable
    """(spec, layout, recipe) -> bool."""
    why: str | Callable
    """The sentence, or (spec, layout, recipe) -> the sentence or None."""


def always(spec, layout, recipe) -> bool:
    return True


def _first(rules, spec, layout, recipe) -> str | None:
    for when, why in rules:
        if when(spec, layout, recipe):
            text = why(spec, layout, recipe) if callable(why) else why
            if text:
                return text
    return None


class Supports(NamedTuple):
    stack: str
    """How its sentences name it: "the torch stack"."""
    unsupported: tuple = ()
    refused: tuple = ()
    optimizers: tuple = ("sgd", "adam")
    """The ``OptimizerSpec`` names it trains (AdamW, "adamw", where it decays by the spec's rule; Muon, "muon", where
    it steps the hidden matrices by Muon's rule); another is unsupported after its own rules (which may say why in its
    own words)."""
    hybrid: bool = False
    """Whether it shards hybrid (``Layout.replicate`` > 1); if not, such a layout is unsupported after its rules."""
    selective: bool = False
    """Whether it checkpoints selectively (``Layout.checkpoint_policy`` "selective")."""
    compiles: bool = False
    """Whether it compiles its blocks (``Layout.compile``)."""
    schedules: bool = False
    """Whether it runs a learning-rate schedule (``Recipe.lr_schedule``) with its own scheduler."""

    def why_unsupported(self, spec, layout, recipe) -> str | None:
        unknown = sorted({**spec.extra, **layout.extra})
        if unknown:
            return f"{self.stack} does not know {', '.join(unknown)}."
        why = _first(self.unsupported, spec, layout, recipe)
        if why is None and recipe.optimizer.name not in self.optimizers:
            why = f"{self.stack} does not train with {recipe.optimizer.name} (it trains {', '.join(self.optimizers)})."
        if why is None and layout.replicate > 1 and not self.hybrid:
            why = f"{self.stack} does not shard hybrid (replicate x shard) here."
        if why is None and layout.checkpoint_policy == "selective" and not self.selective:
            why = f"{self.stack} does not checkpoint selectively (the matmuls saved, the rest recomputed) here."
        if why is None and layout.compile and not self.compiles:
            why = f"{self.stack} does not compile its blocks here."
        if why is None and recipe.lr_schedule is not None and not self.schedules:
            why = f"{self.stack} does not schedule its learning rate here."
        return why

    def why_refused(self, spec, layout, recipe) -> str | None:
        return _first(self.refused, spec, layout, recipe)

    def check(self, spec, layout, recipe) -> None:
        why = self.why_unsupported(spec, layout, recipe)
        if why:
            raise Unsupported(why)
        why = self.why_refused(spec, layout, recipe)
        if why:
            raise ValueError(why)
