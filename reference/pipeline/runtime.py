"""The reference pipeline runtime: one interpreter that walks a rank's action list over its stages.

Activations go forward and gradients backward by point-to-point send/recv in the explicitly passed
group (gloo: tagged, so messages of different stages between the same two ranks cannot be confused;
nccl matches in posting order). Consecutive sends and receives of a rank's list are posted as one
group (batch_isend_irecv); its receives are waited for there, its sends at the end of the step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..errors import Unsupported
from .schedule import Action, Schedule, add_send_recv
from .validate import validate


def _tag(a: Action, num_microbatches: int) -> int:
    """Distinct per (edge between stages e and e+1, microbatch, direction): SEND_F(s) and RECV_F(s+1)
    share edge s going forward; SEND_B(s+1) and RECV_B(s) share it going backward."""
    edge = {"SEND_F": a.stage, "RECV_F": a.stage - 1, "SEND_B": a.stage - 1, "RECV_B": a.stage}[a.kind]
    direction = 0 if a.kind.endswith("_F") else 1
    return (edge * num_microbatches + a.microbatch) * 2 + direction


@dataclass
class _Pass:
    """One pass's tensors in flight on this rank, keyed by (stage, microbatch)."""

    xs: list | None
    ts: list | None
    x_in: dict = field(default_factory=dict)
    y_out: dict = field(default_factory=dict)
    grad_in: dict = field(default_factory=dict)
    grad_out: dict = field(default_factory=dict)
    for_w: dict = field(default_factory=dict)
    losses: list = field(default_factory=list)
    works: list = field(default_factory=list)


class PipelineRuntime:
    """Runs ``schedule``'s actions for this rank over ``stages`` (stage index -> module it holds).

    Every activation and activation gradient between stages is a (rows, *sample_shape) tensor of the
    stages' dtype, rows being the microbatch's share of ``batch_size`` under ``tensor_split``.
    ``on_compute(stage, microbatch)``, when given, is called before every F, B, I and W (a forward or a
    backward that may recompute): e.g. to key dropout by the microbatch's global samples.

    The schedule is validated first (a broken one raises ``ScheduleError`` before anything is sent). Stage s
    lives on rank ``schedule.placement[s]``: the loop (s mod p) or the V, where a stage's successor may be on
    the same rank and the first and the last stage share rank 0 (a parameter tied between them then simply
    accumulates both stages' gradients). An overlapped pair (DualPipe's F&B) runs its forward, then its
    backward: the validator has made sure the backward does not need that forward.
    """

    def __init__(self, schedule: Schedule, stages: dict[int, torch.nn.Module], loss_fn, batch_size: int,
                 sample_shape: tuple[int, ...], group=None, on_compute=None):
        validate(schedule)
        self.schedule = schedule if schedule.meta.get("lowered") else add_send_recv(schedule)
        self.stages, self.loss_fn, self.group, self.on_compute = stages, loss_fn, group, on_compute
        self.rows = [len(c) for c in torch.arange(batch_size).tensor_split(schedule.num_microbatches)]
        self.sample_shape = tuple(sample_shape)
        first = next(iter(stages.values())).parameters().__next__()
        self.dtype, self.device = first.dtype, first.device
        self.rank = dist.get_rank(group)
        self.tagged = dist.get_backend(group) != "nccl"
        self.events: list[tuple[str, float, float]] = []
        self.peak_held = 0
        """Most stage activations this rank held at once in the last step (forwards whose backward, B or W,
        had not run yet), counted on the runtime's own tensors after each compute; an overlapped pair counts
        once both its halves ran, as the simulator's ``peak_in_flight`` does."""
        self._pair_first = {f for f, _ in self.schedule.meta.get("overlap", ())}

    def step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> torch.Tensor | None:
        """One forward + backward of the whole batch, split into microbatches with ``tensor_split``;
        gradients accumulate (sum) into the stages' parameters. Returns the summed loss on the rank
        that holds the last stage, None elsewhere. ``events`` holds (action, start, end) seconds."""
        m = self.schedule.num_microbatches
        run = _Pass(list(inputs.tensor_split(m)) if inputs is not None else None,
                    list(targets.tensor_split(m)) if targets is not None else None)
        self.events = []
        self.peak_held = 0
        t0 = time.perf_counter()
        for unit in _units(self.schedule.actions[self.rank]):
            start = time.perf_counter() - t0
            if isinstance(unit, list):  # consecutive sends and receives, posted as one group
                self._exchange(unit, run)
                end = time.perf_counter() - t0
                self.events += [(str(a), start, end) for a in unit]
                continue
            if self.on_compute is not None:
                self.on_compute(unit.stage, unit.microbatch)
            self._compute(unit, run)
            self.events.append((str(unit), start, time.perf_counter() - t0))
            if unit not in self._pair_first:
                self.peak_held = max(self.peak_held, len(run.y_out))
        for work, _ in run.works:
            work.wait()
        return torch.stack(run.losses).sum() if run.losses else None

    def _exchange(self, unit: list, run: _Pass) -> None:
        """Post one run of sends and receives as a group; wait for the receives (the sends complete later)."""
        place = self.schedule.placement
        ops, receives = [], []
        for a in unit:
            s, j = a.stage, a.microbatch
            if a.kind.startswith("SEND"):
                t = run.y_out[(s, j)].detach() if a.kind == "SEND_F" else run.grad_in.pop((s, j))
                ops.append(self._op(dist.isend, t, place[s + 1] if a.kind == "SEND_F" else place[s - 1], a))
            else:
                buf = torch.empty((self.rows[j], *self.sample_shape), dtype=self.dtype, device=self.device)
                (run.x_in if a.kind == "RECV_F" else run.grad_out)[(s, j)] = buf
                receives.append(len(ops))
                ops.append(self._op(dist.irecv, buf, place[s - 1] if a.kind == "RECV_F" else place[s + 1], a))
        for k, work in enumerate(dist.batch_isend_irecv(ops)):
            if k in receives:
                work.wait()
            else:
                run.works.append((work, ops[k].tensor))  # keep the sent tensor alive until done

    def _compute(self, a: Action, run: _Pass) -> None:
        """One F, B, I (the input gradient alone) or W (the weight gradient, after its I)."""
        s, j, last = a.stage, a.microbatch, self.schedule.num_stages - 1
        if a.kind == "F":
            if s == 0:
                x = run.xs[j]
            elif (s, j) in run.x_in:
                x = run.x_in.pop((s, j))
            else:  # the previous stage lives on this rank
                x = run.y_out[(s - 1, j)].detach()
            x = x.requires_grad_(s > 0)
            y = self.stages[s](x)
            run.x_in[(s, j)] = x
            run.y_out[(s, j)] = self.loss_fn(y, run.ts[j]) if s == last else y
            if s == last:
                run.losses.append(run.y_out[(s, j)].detach())
        elif a.kind in ("B", "I"):
            g = None if s == last else run.grad_out.pop((s, j), None)
            if g is None and s < last:
                g = run.grad_in.pop((s + 1, j))  # the next stage lives on this rank
            x, y = run.x_in[(s, j)], run.y_out[(s, j)]
            if a.kind == "B":
                y.backward(g)
                if s > 0:
                    run.grad_in[(s, j)] = x.grad
                del run.x_in[(s, j)], run.y_out[(s, j)]
            else:
                if s > 0:
                    (run.grad_in[(s, j)],) = torch.autograd.grad(y, [x], g, retain_graph=True)
                run.for_w[(s, j)] = g  # the output gradient W needs, kept until W runs
        elif a.kind == "W":
            y = run.y_out.pop((s, j))
            del run.x_in[(s, j)]
            for p, gw in self.weight_gradients(self.stages[s], y, run.for_w.pop((s, j))):
                p.grad = gw if p.grad is None else p.grad + gw

    @staticmethod
    def weight_gradients(stage: torch.nn.Module, y: torch.Tensor, g: torch.Tensor | None) -> list:
        """W: (parameter, gradient) for every trainable parameter of ``stage``, each once, however many times
        the forward used it (autograd sums the uses)."""
        params = [p for p in stage.parameters() if p.requires_grad]
        return list(zip(params, torch.autograd.grad(y, params, g), strict=True))

    def _op(self, op, t: torch.Tensor, peer: int, a: Action) -> dist.P2POp:
        tag = _tag(a, self.schedule.num_microbatches) if self.tagged else 0
        return dist.P2POp(op, t.contiguous(), group=self.group, group_peer=peer, tag=tag)


def _units(row):
    """A rank's actions as compute actions and runs of consecutive sends/receives (each run one group:
    nccl runs a pair's point-to-point ops in order on one stream and would deadlock on two ranks that
    both send before receiving, unless the send and the receive are grouped, as torch's pipelining does)."""
    units, run = [], []
    for a in row:
        if a is None:
            continue
        if a.kind in ("SEND_F", "RECV_F", "SEND_B", "RECV_B"):
            run.append(a)
            continue
        if run:
            units.append(run)
            run = []
        units.append(a)
    if run:
        units.append(run)
    return units


class ReferencePipeline:
    """The pipeline contract on ``PipelineRuntime`` and the generators of ``reference.pipeline``."""

    def build(self, stages, num_stages, schedule, num_microbatches, virtual_stages, loss_fn, batch_size,
              sample_shape, group=None) -> PipelineRuntime:
        return PipelineRuntime(self.schedule(schedule, num_stages, num_microbatches, virtual_stages, batch_size,
                                             group), stages, loss_fn, batch_size, sample_shape, group)

    @staticmethod
    def schedule(schedule, num_stages, num_microbatches, virtual_stages, batch_size, group=None) -> Schedule:
        """The named schedule for this group, or ``Unsupported`` / ``ValueError`` saying why not."""
        from .generators import GENERATORS, INTERLEAVED, V_SHAPED, generate, stages_per_rank

        p = dist.get_world_size(group)
        if schedule not in GENERATORS:
            raise ValueError(f"schedule must be one of {', '.join(GENERATORS)}; got {schedule!r}.")
        if num_stages != p * virtual_stages:
            raise ValueError(f"num_stages ({num_stages}) must be ranks ({p}) * virtual_stages ({virtual_stages}).")
        if batch_size < num_microbatches:
            raise ValueError(f"batch_size ({batch_size}) must be at least num_microbatches ({num_microbatches}).")
        if virtual_stages != stages_per_rank(schedule, virtual_stages):
            runs = "two stages per rank (a V)" if schedule in V_SHAPED else "one stage per rank"
            raise Unsupported(f"{schedule} runs {runs}; virtual_stages={virtual_stages} asks for another count "
                              f"({', '.join(INTERLEAVED)} take any).")
        try:
            return generate(schedule, p, num_microbatches, virtual_stages)
        except ValueError as exc:  # the schedule's own rule, e.g. interleaved needs m a multiple of p
            raise Unsupported(str(exc)) from exc
