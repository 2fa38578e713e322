"""A pipeline schedule is data: per rank, an ordered list of actions, printed as torch.distributed.pipelining
prints them (``2F0`` = stage 2 forward of microbatch 0, ``1SEND_B3`` = stage 1 sends the gradient of
microbatch 3 to stage 0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

COMPUTE = ("F", "B", "I", "W")
COMM = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
KINDS = COMPUTE + COMM
_ACTION_RE = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d+)$")


@dataclass(frozen=True, order=True)
class Action:
    """One step of one rank: ``kind`` (F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B) of ``stage`` on
    ``microbatch``. B is the full backward; I (input gradient) and W (weight gradient) split it."""

    stage: int
    kind: str
    microbatch: int

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"action kind must be one of {', '.join(KINDS)}; got {self.kind!r}.")

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        m = _ACTION_RE.match(text.strip())
        if not m:
            raise ValueError(f"{text!r} is not an action; expected stage, kind, microbatch as in 2F0 or 1SEND_B3.")
        return cls(int(m.group(1)), m.group(2), int(m.group(3)))


@dataclass
class Schedule:
    """Per-rank action lists (None = an idle slot), the stage count and the stage -> rank placement."""

    actions: list[list[Action | None]]
    num_stages: int
    num_microbatches: int
    placement: tuple[int, ...]
    """placement[s] is the rank that runs stage s: ``loop`` (s mod p) or ``v`` (0..p-1, then p-1..0)."""
    name: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def num_ranks(self) -> int:
        return len(self.actions)

    def __str__(self) -> str:
        width = max((len(str(a)) for row in self.actions for a in row if a), default=2)
        lines = [f"{self.name or 'schedule'}: {self.num_ranks} ranks, {self.num_stages} stages, "
                 f"{self.num_microbatches} microbatches"]
        for r, row in enumerate(self.actions):
            cells = [str(a).rjust(width) if a else ".".rjust(width) for a in row]
            lines.append(f"rank {r}: " + " ".join(cells))
        if self.meta.get("overlap"):
            lines.append("overlapped (F&B, one unit): " + " ".join(f"{f}&{b}" for f, b in self.meta["overlap"]))
        return "\n".join(lines)


def check_counts(p: int, m: int, v: int = 1) -> None:
    """A generator's p (ranks), m (microbatches) and v (chunks per rank) are whole numbers >= 1."""
    for name, value in (("p", p), ("m", m), ("v", v)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1; got {value!r}.")


def loop_placement(p: int, stages: int) -> tuple[int, ...]:
    return tuple(s % p for s in range(stages))


def v_placement(p: int) -> tuple[int, ...]:
    return tuple(range(p)) + tuple(reversed(range(p)))


def add_send_recv(schedule: Schedule) -> Schedule:
    """Lower a compute-only schedule: a SEND after every compute whose result crosses to another rank,
    the matching RECV right before the compute that needs it."""
    place, last = schedule.placement, schedule.num_stages - 1
    partner = dict(schedule.meta.get("overlap", ()))

    def receives(a: Action, rank: int) -> list[Action]:
        s, j = a.stage, a.microbatch
        if a.kind == "F" and s > 0 and place[s - 1] != rank:
            return [Action(s, "RECV_F", j)]
        return [Action(s, "RECV_B", j)] if a.kind in ("B", "I") and s < last and place[s + 1] != rank else []

    def sends(a: Action, rank: int) -> list[Action]:
        s, j = a.stage, a.microbatch
        if a.kind == "F" and s < last and place[s + 1] != rank:
            return [Action(s, "SEND_F", j)]
        return [Action(s, "SEND_B", j)] if a.kind in ("B", "I") and s > 0 and place[s - 1] != rank else []

    lowered = []
    for rank, row in enumerate(schedule.actions):
        out: list[Action | None] = []
        i = 0
        while i < len(row):
            a = row[i]
            if a is None or a.kind not in COMPUTE:
                out.append(a)
                i += 1
                continue
            # an overlapped pair stays adjacent: both receives before it, both sends after it
            unit = [a, row[i + 1]] if i + 1 < len(row) and partner.get(a) == row[i + 1] else [a]
            out += [x for u in unit for x in receives(u, rank)] + unit + [x for u in unit for x in sends(u, rank)]
            i += len(unit)
        lowered.append(out)
    return Schedule(lowered, schedule.num_stages, schedule.num_microbatches, schedule.placement,
                    schedule.name, dict(schedule.meta, lowered=True))
