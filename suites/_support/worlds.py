"""What a test asks of a World beyond its calls: a setting changed for one call and put back; the backend it needs."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def hang_window(world, seconds: float):
    """``world`` calling a hang after ``seconds`` without progress (a planted hang named in seconds, not the default
    10: tox's budget), its own window put back after, whatever the call did."""
    saved, world.hang_window = world.hang_window, seconds
    try:
        yield world
    finally:
        world.hang_window = saved


def gloo_only(world, why: str) -> None:
    """Skip the calling test unless ``world`` runs gloo, with ``why`` and the backend it runs: for what only a CPU /
    gloo World can show — a finding on CPU tensors and CPU meshes (under nccl the default group has no CPU backend:
    torch refuses a CPU tensor there before the code under test runs), or a wait the hang window reads as idle (under
    nccl a waiting rank may spin: the deadline governs, as ``harness.runtime.hang`` says)."""
    import pytest

    if world.backend != "gloo":
        pytest.skip(f"{why}; this World runs {world.backend}")
