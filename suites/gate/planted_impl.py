"""An implementation spec whose behaviour the environment chooses (``PARITYBENCH_GATE_PLANT=1``: all_gather
leaves the last element of its output unwritten), so that a baseline and a new run share the spec's name,
as a user's implementation does across two commits."""

from __future__ import annotations

import os

from harness.adapters.torch.collectives import TorchCollectives


class _Planted(TorchCollectives):
    def all_gather(self, output, input, group=None):
        keep = output.view(-1)[-1].clone()
        super().all_gather(output, input, group)
        output.view(-1)[-1] = keep


def impl():
    return _Planted() if os.environ.get("PARITYBENCH_GATE_PLANT") else TorchCollectives()
