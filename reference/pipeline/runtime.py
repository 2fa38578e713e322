"""The reference pipeline runtime: one interpreter that walks a rank's action list over its stages.

Activations go forward and gradients backward by point-to-point send/recv in the explicitly passed
group (gloo: tagged, so messages of different stages between the same two ranks cannot be confused;
nccl matches in posting order, which the lowered schedule keeps the same on both sides of a pair).
Sends are asynchronous and waited for at the end of the step; a RECV blocks, where the schedule puts it.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ..errors import Unsupported
from .schedule import Action, Schedule, add_send_recv


def _tag(a: Action, num_microbatches: int) -> int:
    """Distinct per (edge between stages e and e+1, microbatch, direction): SEND_F(s) and RECV_F(s+1)
    share edge s going forward; SEND_B(s+1) and RECV_B(s) share it going backward."""
    edge = {"SEND_F": a.stage, "RECV_F": a.stage - 1, "SEND_B": a.stage - 1, "RECV_B": a.stage}[a.kind]
    direction = 0 if a.kind.endswith("_F") else 1
    return (edge * num_microbatches + a.microbatch) * 2 + direction


class PipelineRuntime:
    """Runs ``schedule``'s actions for this rank over ``stages`` (stage index -> module it holds).

    Every activation and activation gradient between stages is a (rows, *sample_shape) tensor of the
    stages' dtype, rows being the microbatch's share of ``batch_size`` under ``tensor_split``.
    """

    def __init__(self, schedule: Schedule, stages: dict[int, torch.nn.Module], loss_fn, batch_size: int,
                 sample_shape: tuple[int, ...], group=None):
        self.schedule = schedule if schedule.meta.get("lowered") else add_send_recv(schedule)
        self.stages, self.loss_fn, self.group = stages, loss_fn, group
        self.rows = [len(c) for c in torch.arange(batch_size).tensor_split(schedule.num_microbatches)]
        self.sample_shape = tuple(sample_shape)
        first = next(iter(stages.values())).parameters().__next__()
        self.dtype, self.device = first.dtype, first.device
        self.rank = dist.get_rank(group)
        self.tagged = dist.get_backend(group) != "nccl"
        self.events: list[tuple[str, float, float]] = []

    def step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> torch.Tensor | None:
        """One forward + backward of the whole batch, split into microbatches with ``tensor_split``;
        gradients accumulate (sum) into the stages' parameters. Returns the summed loss on the rank
        that holds the last stage, None elsewhere. ``events`` holds (action, start, end) seconds."""
        sched, place = self.schedule, self.schedule.placement
        last, m = sched.num_stages - 1, sched.num_microbatches
        xs = list(inputs.tensor_split(m)) if inputs is not None else None
        ts = list(targets.tensor_split(m)) if targets is not None else None
        x_in, y_out, grad_in, grad_out, losses, works = {}, {}, {}, {}, [], []
        self.events = []
        t0 = time.perf_counter()
        for a in sched.actions[self.rank]:
            if a is None:
                continue
            start = time.perf_counter() - t0
            s, j = a.stage, a.microbatch
            if a.kind == "F":
                if s == 0:
                    x = xs[j]
                elif (s, j) in x_in:
                    x = x_in.pop((s, j))
                else:  # the previous stage lives on this rank
                    x = y_out[(s - 1, j)].detach()
                x = x.requires_grad_(s > 0)
                y = self.stages[s](x)
                x_in[(s, j)] = x
                y_out[(s, j)] = self.loss_fn(y, ts[j]) if s == last else y
                if s == last:
                    losses.append(y_out[(s, j)].detach())
            elif a.kind == "SEND_F":
                works.append(self._send(y_out[(s, j)].detach(), place[s + 1], a))
            elif a.kind == "RECV_F":
                buf = torch.empty((self.rows[j], *self.sample_shape), dtype=self.dtype, device=self.device)
                self._recv(buf, place[s - 1], a)
                x_in[(s, j)] = buf
            elif a.kind == "RECV_B":
                buf = torch.empty((self.rows[j], *self.sample_shape), dtype=self.dtype, device=self.device)
                self._recv(buf, place[s + 1], a)
                grad_out[(s, j)] = buf
            elif a.kind in ("B", "I"):
                g = None if s == last else grad_out.pop((s, j), None)
                if g is None and s < last:
                    g = grad_in.pop((s + 1, j))  # the next stage lives on this rank
                x, y = x_in[(s, j)], y_out[(s, j)]
                if a.kind == "B":
                    y.backward(g)
                    if s > 0:
                        grad_in[(s, j)] = x.grad
                    del x_in[(s, j)], y_out[(s, j)]
                else:
                    if s > 0:
                        (grad_in[(s, j)],) = torch.autograd.grad(y, [x], g, retain_graph=True)
                    grad_out[("W", s, j)] = g
            elif a.kind == "W":
                y = y_out.pop((s, j))
                del x_in[(s, j)]
                params = [p for p in self.stages[s].parameters() if p.requires_grad]
                for p, gw in zip(params, torch.autograd.grad(y, params, grad_out.pop(("W", s, j))), strict=True):
                    p.grad = gw if p.grad is None else p.grad + gw
            elif a.kind == "SEND_B":
                works.append(self._send(grad_in.pop((s, j)), place[s - 1], a))
            self.events.append((str(a), start, time.perf_counter() - t0))
        for w in works:
            w.wait()
        return torch.stack(losses).sum() if losses else None

    def _send(self, t: torch.Tensor, peer: int, a: Action):
        t = t.contiguous()
        if self.tagged:
            return dist.isend(t, group=self.group, group_dst=peer, tag=_tag(a, self.schedule.num_microbatches))
        return dist.isend(t, group=self.group, group_dst=peer)

    def _recv(self, t: torch.Tensor, peer: int, a: Action) -> None:
        if self.tagged:
            dist.recv(t, group=self.group, group_src=peer, tag=_tag(a, self.schedule.num_microbatches))
        else:
            dist.recv(t, group=self.group, group_src=peer)


class ReferencePipeline:
    """The pipeline contract on ``PipelineRuntime`` and the generators of ``reference.pipeline``."""

    def build(self, stages, num_stages, schedule, num_microbatches, virtual_stages, loss_fn, batch_size,
              sample_shape, group=None) -> PipelineRuntime:
        from .generators import GENERATORS

        p = dist.get_world_size(group)
        if schedule not in GENERATORS:
            raise ValueError(f"schedule must be one of {', '.join(GENERATORS)}; got {schedule!r}.")
        if num_stages != p * virtual_stages:
            raise ValueError(f"num_stages ({num_stages}) must be ranks ({p}) * virtual_stages ({virtual_stages}).")
        if batch_size < num_microbatches:
            raise ValueError(f"batch_size ({batch_size}) must be at least num_microbatches ({num_microbatches}).")
        if virtual_stages != 1 and schedule != "interleaved":
            raise Unsupported(f"{schedule} runs one stage per rank; virtual_stages={virtual_stages} needs interleaved.")
        try:
            sched = GENERATORS[schedule](p, num_microbatches, virtual_stages) if schedule == "interleaved" \
                else GENERATORS[schedule](p, num_microbatches)
        except ValueError as exc:  # the schedule's own rule, e.g. interleaved needs m a multiple of p
            raise Unsupported(str(exc)) from exc
        return PipelineRuntime(sched, stages, loss_fn, batch_size, sample_shape, group)
