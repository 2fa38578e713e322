"""The precision-matched oracle every low-precision case is held to: one device running the same recipe
(``OneDevice``: low-precision forward and backward, fp32 masters, the loss scaled, clipping) and how far a parallel
run may be from it in units of E_T, one device's own distance from exact arithmetic (``allowed_ratio``). The stack
suite, the 3D suite, resume and expert parallelism's third parties read it here."""

from __future__ import annotations

import copy
import math

import torch

from reference.mixed_precision import DynamicLossScaler
from reference.models import GPT
from reference.models.moe import zero_missing_grads
from reference.zero import LRSchedule, OptimizerSpec, Scheduled

LR = 0.05
"""The SGD learning rate of the one-device recipe when none is given (the 3D suite's)."""


def allowed_ratio(microbatches: int, accumulation: int, dp: int, tp: int) -> float:
    """How far the parallel run's masters may be from one device's, in units of E_T — the largest
    difference of one device's low-precision run from exact arithmetic (float64) over the whole dense
    tensor T, measured on every rank.

    Both runs are the same low-precision computation, rounded in different places: by the triangle
    inequality |parallel - one device| <= |parallel - exact| + E_T. One device rounds a weight gradient
    element once (one GEMM over the whole batch, accumulated in fp32) and a row-parallel layer's output
    once; the parallel run rounds each microbatch's partial gradient of each accumulation pass
    (m k), the DP reduction's partial sums (<= dp), and each TP rank's partial output plus the TP
    all-reduce's sums (2 tp). Rounding errors of independent operations add in quadrature (the
    probabilistic model of Higham & Mary 2019: an error grows as the square root of the number of
    roundings, not linearly), so |parallel - exact| <= sqrt(m k + dp + 2 tp) x one device's error,
    where a tensor's maximum over n >= 16 elements of such an error fluctuates by up to 2x around its
    typical value: 1 + 2 sqrt(m k + dp + 2 tp) — in the suite (k = 2) from 6.3 (one rank, m = 2) to 10.2
    (tp 8).
    A missing DP average moves masters 180-2,200 E_T (measured: 2x1x1 to 8x1x1)."""
    return 1 + 2 * math.sqrt(microbatches * accumulation + dp + 2 * tp)


class OneDevice:
    """The recipe on one device: ``model`` (low precision, or float64 for exact arithmetic) with an fp32
    master copy (float64: the parameters themselves), the cross-entropy in fp32, the loss scaled, the
    gradients unscaled in fp32, the step skipped on an inf / NaN, clipped by torch's clip_grad_norm_.
    ``grads``: the last step's gradients before clipping; ``norm``: its norm."""

    def __init__(self, model: GPT, scaler: DynamicLossScaler | None, optimizer: OptimizerSpec | None = None,
                 schedule: LRSchedule | None = None):
        self.model, self.scaler = model, scaler
        self.lr = Scheduled(schedule)
        self.lr_factor = 1.0
        """The last applied update's learning rate as a fraction of the spec's (its schedule's factor)."""
        self.low = next(model.parameters()).dtype != torch.float64
        self.masters = ([torch.nn.Parameter(p.detach().float().clone()) for p in model.parameters()] if self.low
                        else list(model.parameters()))
        self.opt = (optimizer or OptimizerSpec("sgd", LR)).build(self.masters)
        self.norm, self.grads, self.applied = None, [], False

    def step(self, step: int, tokens, targets, clip, skip: bool | None = None) -> float:
        """One step; ``skip``: skip the update (the exact run following a scaled run's skips), None: the scaler's
        decision. ``applied``: whether it updated."""
        model, scale = self.model, self.scaler.scale if self.scaler is not None else 1.0
        model.dropout_key.step, self.norm = step, None
        model.zero_grad()
        loss = model.loss(tokens, targets)
        (loss * scale).backward()
        zero_missing_grads(model.parameters())  # an expert no token reached, as every stack holds it
        if self.low:
            for m, p in zip(self.masters, model.parameters(), strict=True):
                m.grad = p.grad.float() / scale  # a power of two: exact
        self.grads = [m.grad.detach().double().clone() for m in self.masters]
        self.applied = not skip if skip is not None else \
            self.scaler is None or self.scaler.update_from([m.grad for m in self.masters], {})
        if not self.applied:
            return float(loss.detach())
        if clip:
            self.norm = float(torch.nn.utils.clip_grad_norm_(self.masters, *clip))
        self.lr.before_update([self.opt])
        self.lr_factor = self.lr.factor
        self.opt.step()
        self.lr.after_update()
        if self.low:
            with torch.no_grad():
                for m, p in zip(self.masters, model.parameters(), strict=True):
                    p.copy_(m.to(p.dtype))
        return float(loss.detach())

    def dense(self) -> dict[str, torch.Tensor]:
        """Every parameter by its one-device name (tied ones under both names), as float64."""
        names = [n for n, _ in self.model.named_parameters()]
        # a copy: float64 masters are the exact run's live parameters, which the next step moves
        by_name = dict(zip(names, (m.detach().to(torch.float64, copy=True) for m in self.masters), strict=True))
        return {n: by_name.get(n, by_name.get("embed.weight")) for n, _ in
                self.model.named_parameters(remove_duplicate=False)}

    def dense_optimizer(self, keys) -> dict[str, dict[str, torch.Tensor]]:
        """Each parameter's optimizer state tensors ``keys`` by its one-device name (once), as float64 — those it has:
        none before the first applied update (torch's optimizers create their state lazily)."""
        names = [n for n, _ in self.model.named_parameters()]
        return {n: {k: self.opt.state[m][k].detach().double().clone() for k in keys}
                for n, m in zip(names, self.masters, strict=True) if self.opt.state.get(m)}

    def as_model(self) -> GPT:
        """The float64 model holding the masters (to be split as the parallel run is)."""
        out = copy.deepcopy(self.model).double()
        with torch.no_grad():
            for p, m in zip(out.parameters(), self.masters, strict=True):
                p.copy_(m)
        return out
