"""pytest-benchmark, fed with the time measured inside the ranks.

pytest-benchmark times a callable on the driver; here that would be a ``World.run`` round trip
(pickling, pipes, the barrier), not the operation. So the ranks time every iteration themselves
(``timing.time_iterations``: a barrier, then the operation; CUDA events on a GPU), the driver takes the
max over ranks per iteration (``timing.summarize``), and ``feed`` replays those times through
pytest-benchmark's pedantic mode with ``REPLAY_CLOCK`` as its timer: each round's "duration" is one
in-rank iteration, so its min / max / mean / median / stddev / IQR, ``--benchmark-json``, ``compare``
and ``--benchmark-compare-fail`` describe in-rank time. Tests select the clock with
``@pytest.mark.benchmark(timer=REPLAY_CLOCK)``.
"""

from __future__ import annotations


class ReplayClock:
    """A clock that only moves when ``advance`` is called: the timer pytest-benchmark reads."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __repr__(self) -> str:  # pytest-benchmark records the timer's name in its JSON
        return "paritybench in-rank time (max over ranks per iteration)"


REPLAY_CLOCK = ReplayClock()


def feed(benchmark, samples_us: list[float], **extra_info) -> list[float] | None:
    """Hand ``samples_us`` (per-iteration in-rank times, µs) to pytest-benchmark as its rounds; return the
    round durations it recorded (seconds), or None where it is disabled (``--benchmark-disable``, and under
    pytest-xdist, where pytest-benchmark turns itself off)."""
    if not samples_us:
        raise ValueError("no timed iterations to report")
    pending = iter(samples_us)

    def one_iteration():
        REPLAY_CLOCK.advance(next(pending) * 1e-6)

    benchmark.extra_info.update(extra_info, time_source="in-rank")
    benchmark.pedantic(one_iteration, rounds=len(samples_us), iterations=1, warmup_rounds=0)
    return None if benchmark.disabled else list(benchmark.stats.stats.data)
