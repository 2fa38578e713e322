"""The V-shaped schedules: two stages per rank placed as a V (rank r holds stages r and 2p - 1 - r), so the
first and the last stage share rank 0 and the middle two stages (p - 1 and p) rank p - 1.

- ``zbv``: ZB-V (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", section 6), the backward split into I
  and W; with equal costs F = I = W per stage its only idle time is the fill and drain of one microbatch's
  critical path, and it holds at most 2p stage activations per rank (1F1B's memory, in half-size stages).
- ``dualpipev``: DualPipeV (DeepSeek-V3's DualPipe "cut in half", deepseek-ai/DualPipe): in the steady
  state a forward of one stage is overlapped with a backward of the rank's other stage (``meta["overlap"]``:
  the pairs that run as one unit, F first); the second half of the drain splits its backwards into I and W.

Both are built for max(m, their fill) microbatches and the actions of microbatches >= m dropped: removing
every action of a microbatch removes waits, never adds one, so what is left is still deadlock-free (and
``validate``/``simulate`` check it anyway).
"""

from __future__ import annotations

from .schedule import Action, Schedule, check_counts, v_placement


class _Row:
    """One rank's action list being built: counters per (stage, kind), W's deferred behind their I's, the
    overlapped pairs."""

    def __init__(self, pairs: list):
        self.row: list[Action] = []
        self.count: dict[tuple[int, str], int] = {}
        self.deferred: list[Action] = []
        self.pairs = pairs

    def put(self, s: int, kind: str, *, defer: bool = False) -> Action:
        key = (s, "B" if kind in "BI" else kind)  # B counts the stage's backwards, full or I
        a = Action(s, kind, self.count.get(key, 0))
        self.count[key] = a.microbatch + 1
        if defer and kind == "I":
            self.deferred.append(Action(s, "W", a.microbatch))
        self.row.append(a)
        return a

    def done(self, s: int, kind: str) -> int:
        return self.count.get((s, "B" if kind in "BI" else kind), 0)

    def weight(self, stage: int | None = None) -> None:
        """The oldest deferred W (of ``stage`` when given)."""
        for k, w in enumerate(self.deferred):
            if stage is None or w.stage == stage:
                self.row.append(self.deferred.pop(k))
                return

    def overlapped(self, fwd: int, bwd: int) -> None:
        self.pairs.append((self.put(fwd, "F"), self.put(bwd, "B")))


def _keep(rows: list[list[Action]], m: int, pairs: list[tuple[Action, Action]]) -> tuple[list, list]:
    rows = [[a for a in row if a.microbatch < m] for row in rows]
    return rows, [(f, b) for f, b in pairs if f.microbatch < m and b.microbatch < m]


def zbv(p: int, m: int) -> Schedule:
    """ZB-V: rank r warms up with 2(p - r) - 1 forwards of its first stage, then r pairs of (second stage,
    first stage) forwards, then p - r rounds of F I W on its second stage; the steady state runs F I W on
    each stage in turn; the drain runs the I's first and fills with the deferred W's."""
    check_counts(p, m)
    n = max(2 * p - 1, m)
    rows = []
    for r in range(p):
        s0, s1, b = r, 2 * p - 1 - r, _Row([])
        for _ in range(2 * (p - r) - 1):
            b.put(s0, "F")
        for _ in range(r):
            b.put(s1, "F"), b.put(s0, "F")
        for _ in range(p - r):
            b.put(s1, "F"), b.put(s1, "I"), b.put(s1, "W")
        while b.done(s1, "F") < b.done(s0, "F") or b.done(s0, "F") < n:
            if b.done(s0, "F") < n:
                b.put(s0, "F")
            b.put(s0, "I"), b.put(s0, "W")
            b.put(s1, "F"), b.put(s1, "I"), b.put(s1, "W")
        for _ in range(r):
            b.put(s0, "I", defer=True), b.put(s1, "I", defer=True)
        for _ in range(p - r):
            b.put(s0, "I", defer=True), b.weight(s0)
        b.row += sorted(b.deferred, key=lambda a: a.stage != s1)  # the second stage's W's first, in order
        rows.append(b.row)
    rows, _ = _keep(rows, m, [])
    return Schedule(rows, 2 * p, m, v_placement(p), "zbv", {"v": 2})


def dualpipev(p: int, m: int) -> Schedule:
    """DualPipeV in the eight steps of deepseek-ai/DualPipe's ``dualpipev.py``, for rank r with stages s0 = r
    and s1 = 2p - 1 - r (n = max(m, 2p) microbatches):

    1. (p - r - 1) * 2 forwards of s0;  2. r + 1 pairs F(s0) F(s1);  3. p - r - 1 rounds I(s1), a deferred
    W, F(s1);  4. n - 2p + r + 1 rounds of the overlapped pairs F(s0)&B(s1) and F(s1)&B(s0) (rank p - 1's
    first round not overlapped);  5. p - r - 1 rounds B(s1), F(s1)&B(s0);  6. r + 1 rounds B(s1) B(s0),
    split into I from the middle on;  7. p - r - 1 rounds W, backward of s0;  8. r + 1 deferred W's."""
    check_counts(p, m)
    n = max(m, 2 * p)
    rows, pairs = [], []
    for r in range(p):
        s0, s1, b = r, 2 * p - 1 - r, _Row(pairs)
        for _ in range((p - r - 1) * 2):
            b.put(s0, "F")
        for _ in range(r + 1):
            b.put(s0, "F"), b.put(s1, "F")
        for _ in range(p - r - 1):
            b.put(s1, "I", defer=True), b.weight(), b.put(s1, "F")
        for i in range(n - 2 * p + r + 1):
            if i == 0 and r == p - 1:  # DualPipe's own choice: a smaller bubble without this overlap
                b.put(s0, "F"), b.put(s1, "B")
            else:
                b.overlapped(s0, s1)
            b.overlapped(s1, s0)
        for _ in range(p - r - 1):
            b.put(s1, "B")
            b.overlapped(s1, s0)
        split = False
        for i in range(r + 1):
            if i == (r + 1) // 2 and r % 2 == 1:
                split = True
            b.put(s1, "I" if split else "B", defer=True)
            if i == (r + 1) // 2 and r % 2 == 0:
                split = True
            b.put(s0, "I" if split else "B", defer=True)
        for _ in range(p - r - 1):
            b.weight()
            b.put(s0, "I" if split else "B", defer=True)
        for _ in range(r + 1):
            b.weight()
        rows.append(b.row + b.deferred)
    rows, pairs = _keep(rows, m, pairs)
    return Schedule(rows, 2 * p, m, v_placement(p), "dualpipev", {"v": 2, "overlap": pairs})
