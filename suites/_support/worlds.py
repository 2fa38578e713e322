"""A World's settings a test changes for one call and puts back."""

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
