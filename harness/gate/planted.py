"""Planted slowdowns for the gate's power study: torch's own collectives, each call followed by a busy
wait of a known fraction of the call's own measured time on every rank (``slowed_10``: 10 %), as extra
work in a slower implementation would be. On 2 cores the ranks share the cores, so the busy wait also
slows the other ranks' part of the call: the slowdown measured is larger than the one planted (here
10 / 20 / 50 % measured as a median ratio of 1.16 / 1.47 / 2.31); a sleep instead frees the core and
measured 0.98 / 1.08 / 1.37. The study reports power against both the planted and the measured ratio.

Used as ``--impl harness.gate.planted:slowed_20``; ``slowed_0`` is the same code path with no wait, the
study's baseline, so that the only difference between the two is the planted one.
"""

from __future__ import annotations

import time

from harness.adapters.torch.collectives import TorchCollectives


class SlowedCollectives(TorchCollectives):
    def __init__(self, slowdown: float):
        self.slowdown = slowdown

    def _slowed(self, name, *args, **kwargs):
        start = time.perf_counter()
        getattr(super(), name)(*args, **kwargs)
        until = time.perf_counter() + (time.perf_counter() - start) * self.slowdown
        while time.perf_counter() < until:
            pass

    def all_reduce(self, tensor, op="sum", group=None):
        self._slowed("all_reduce", tensor, op, group)

    def reduce_scatter(self, output, input, op="sum", group=None):
        self._slowed("reduce_scatter", output, input, op, group)

    def all_gather(self, output, input, group=None):
        self._slowed("all_gather", output, input, group)

    def broadcast(self, tensor, src, group=None):
        self._slowed("broadcast", tensor, src, group)

    def reduce(self, tensor, dst, op="sum", group=None):
        self._slowed("reduce", tensor, dst, op, group)

    def all_to_all(self, output, input, group=None):
        self._slowed("all_to_all", output, input, group)


def slowed_0():
    return SlowedCollectives(0.0)


def slowed_10():
    return SlowedCollectives(0.10)


def slowed_20():
    return SlowedCollectives(0.20)


def slowed_50():
    return SlowedCollectives(0.50)
