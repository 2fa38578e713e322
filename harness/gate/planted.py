"""Planted slowdowns for the gate's power study: torch's own collectives, each call made slower by a
known fraction (``slowed_10``: 10 %) by waiting that fraction of the call's own measured time on every
rank. The wait sleeps and busy-waits only its last ``SPIN`` seconds: a sleep alone overshoots by tens of
microseconds (10 % of a 1 ms call is 100 us), and a busy wait alone takes the core from the other ranks
(4 ranks on 2 cores), which made a planted 20 % measure as 47 % in a first study.

Used as ``--impl harness.gate.planted:slowed_20``; ``slowed_0`` is the same code path with no wait, the
study's baseline, so that the only difference between the two is the planted one.
"""

from __future__ import annotations

import time

from ..adapters.torch_collectives import TorchCollectives


SPIN = 100e-6


class SlowedCollectives(TorchCollectives):
    def __init__(self, slowdown: float):
        self.slowdown = slowdown

    def _slowed(self, name, *args, **kwargs):
        start = time.perf_counter()
        getattr(super(), name)(*args, **kwargs)
        now = time.perf_counter()
        until = now + (now - start) * self.slowdown
        if until - now > SPIN:
            time.sleep(until - now - SPIN)
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
