"""What the stack adapters share: a trainer built from a one-device model — the one ``load_dense`` gives
it, else the spec's seed 0 on first use — so that each case builds the parallel trainer once."""

from __future__ import annotations


class BuiltFromDense:
    """Subclasses set ``spec`` and provide ``_build(model)`` (the parallel trainer of a one-device model)."""

    _trainer = None

    def _build(self, model):
        raise NotImplementedError

    @property
    def trainer(self):
        if self._trainer is None:
            self._trainer = self._build(self.spec.build(0))
        return self._trainer

    def load_dense(self, state: dict) -> None:
        model = self.spec.build(0)
        model.load_state_dict(state)
        self._trainer = self._build(model)
