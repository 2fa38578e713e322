"""The 3D mixed-precision conformance case (rank side): a bfloat16 / float16 GPT (tied, keyed dropout,
clipped, accumulating — the 3D suite's recipe) trained over (dp, pp, tp) with fp32 masters
(``reference.stack.compose.Parallel3D`` in mixed precision) against one device running the same recipe on the
whole batch, every rank's fp32 masters compared; the bound is ``allowed_ratio`` x the one-device recipe's
own distance from exact arithmetic (the same recipe in float64)."""

from __future__ import annotations

import copy
import math

import torch
import torch.distributed as dist

from harness.runtime.rank import computed_once
from harness.runtime.world import rank_device
from harness.stack.precision import OneDevice, allowed_ratio  # noqa: F401 - the 3D suite holds its runs to them
from harness.threed.case import CLIP, LR, _groups, global_batch
from reference.mixed_precision import DynamicLossScaler
from reference.models import GPT
from reference.resume.threed import tensor_map
from reference.stack.compose import parallelize, shard_stages
from reference.stack.topology import ParallelDims
from reference.zero import OptimizerSpec

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
FP16_SCALER = {"init_scale": 2.0**20, "backoff_factor": 2.0**-6, "growth_interval": 2}
"""float16's dynamic loss scaler: step 1 at 2^20 overflows on every layout and on one device (this model's
gradients overflow float16 from a scale of about 2^15-2^17), is skipped, the scale backs off to 2^14 —
clean everywhere — and doubles after 2 clean steps. The band 2^15-2^17 is avoided on purpose: there a
rounding decides whether a step overflows, and a parallel run (whose replicas' local gradients are not
the average) may legitimately skip a step that one device takes (measured at 2x1x1 and 2x2x2)."""


def _plant_missing_average(trainer, dp: int) -> None:
    reduce = trainer.sync.reduce

    def summed():  # the DP reduction sums and forgets to divide by dp
        reduce()
        for g in trainer.sync.grads:
            g.mul_(dp)
    trainer.sync.reduce = summed


def train_3d_mixed(dp: int, pp: int, tp: int, schedule: str, zero: int, checkpointing: bool,
                   dtype_name: str = "bfloat16", reduce_name: str = "float32", steps: int = 3, seed: int = 0,
                   dropout: float = 0.1, clip: list | None = CLIP, accumulation: int = 2,
                   planted: str | None = None) -> dict:
    """``reduce_name``: the DP reduction in "float32" or "low" precision. float16 trains with the dynamic
    loss scaler ``FP16_SCALER`` (its state must equal one device's: the same steps skipped).
    ``planted`` "missing-average": the DP reduction sums the replicas' gradients."""
    dims, dtype = ParallelDims(dp, pp, tp), DTYPES[dtype_name]
    groups = _groups(dims)
    torch.manual_seed(seed)
    model = GPT(dropout=dropout, tie_embeddings=True, dtype=dtype).to(rank_device())
    scaler = (lambda: DynamicLossScaler(**FP16_SCALER)) if dtype == torch.float16 else (lambda: None)
    try:
        trainer = parallelize(copy.deepcopy(model), dims, schedule, zero, checkpointing, groups=groups,
                              optimizer=OptimizerSpec("sgd", LR), max_grad_norm=clip[0][0] if clip else None,
                              accumulation=accumulation, loss_scaler=scaler(),
                              reduce_dtype=torch.float32 if reduce_name == "float32" else dtype)
    except ValueError as exc:
        return {"refused": str(exc)}
    if planted == "missing-average":
        _plant_missing_average(trainer, dp)
    m = trainer.schedule.num_microbatches
    ratio = allowed_ratio(m, accumulation, dp, tp)
    tokens, targets = global_batch(model.vocab, dp * m * accumulation, seed)
    key = (dtype_name, seed, steps, dropout, tuple(clip or ()), tuple(tokens.shape))
    oracle = computed_once(_ORACLES, key, lambda: _oracle(model, tokens, targets, steps, clip, scaler))
    problems, norms = [], []
    for step, (want, scale) in enumerate(oracle["steps"]):
        c = clip[step % len(clip)] if clip else None
        if c:
            trainer.max_grad_norm, trainer.norm_type = c
        trainer.step(tokens, targets)
        got = trainer.last_grad_norm
        if c and (got is None) != (want is None):
            problems.append(f"step {step + 1}: taken on {'one device' if got is None else 'the parallel run'} "
                            f"only (norm {got!r} vs one device {want!r})")
        elif c and want is not None:  # |n' - n| <= |g' - g|, held to the gradients' own scale
            diff = abs(got - want)
            norms.append((got, want, diff / max(scale, 1e-300)))
            if not diff <= ratio * scale:
                problems.append(f"gradient norm at step {step + 1}: {got!r} vs one device {want!r} "
                                f"(off by {diff:.3g} > {ratio:.3g} x {scale:.3g})")
    worst, more = _compare_masters(trainer, dims, groups, schedule, oracle, ratio)
    problems += more
    if oracle["scaler"] is not None and trainer.loss_scaler.state_dict() != oracle["scaler"]:
        problems.append(f"rank {dist.get_rank()}: loss scaler {trainer.loss_scaler.state_dict()} != one "
                        f"device's {oracle['scaler']}")
    return {"refused": None, "worst": worst, "bound": ratio, "problems": problems, "norms": norms,
            "scaler": trainer.loss_scaler.state_dict() if trainer.loss_scaler else None}


_ORACLES: dict = {}
"""One device's results per (dtype, seed, steps, dropout, clip, batch shape), computed once per World by
rank 0 and broadcast: 8 ranks on 2 cores would otherwise each train the same two oracles."""


def _oracle(model: GPT, tokens, targets, steps: int, clip, scaler) -> dict:
    """One device's recipe in the low precision and in float64: per step (its norm or None when skipped,
    |g - g_float64|), the low-precision run's masters as a float64 GPT (to split as the parallel run is),
    both runs' dense tensors by name, its loss scaler's state — on the CPU (broadcast as objects)."""
    single, exact = OneDevice(copy.deepcopy(model), scaler()), OneDevice(copy.deepcopy(model).double(), None)
    per_step = []
    for step in range(steps):
        c = clip[step % len(clip)] if clip else None
        single.step(step, tokens, targets, c)
        exact.step(step, tokens, targets, c)
        scale = math.sqrt(sum(float(((a - b) ** 2).sum()) for a, b in zip(single.grads, exact.grads, strict=True)))
        per_step.append((single.norm, scale))
    return {"steps": per_step, "split_from": single.as_model().cpu(),
            "single": {k: v.cpu() for k, v in single.dense().items()},
            "exact": {k: v.cpu() for k, v in exact.dense().items()},
            "scaler": single.scaler.state_dict() if single.scaler is not None else None}


def _compare_masters(trainer, dims, groups, schedule, oracle: dict, ratio: float):
    """(largest |parallel - one device| / E_T over this rank's tensors, one line per tensor beyond
    ``ratio`` x E_T); E_T from the dense tensors, the parallel masters against one device's split alike."""
    virtual = 2 if schedule == "interleaved" else 1
    split = shard_stages(oracle["split_from"].to(rank_device()), dims, dist.get_rank(), groups["tp"], virtual)
    expected = [p.cpu() for s in trainer.stages for p in split[s].parameters()]  # trainer.local order
    ones, exacts = oracle["single"], oracle["exact"]
    worst, problems = 0.0, []
    for got, want, (_, name, *_) in zip(trainer.sync.full_masters(), expected, tensor_map(trainer), strict=True):
        scale = float((ones[name] - exacts[name]).abs().max())
        diff = float((got.double().cpu() - want.detach()).abs().max())
        worst = max(worst, diff / max(scale, 1e-300))
        if not diff <= ratio * scale:
            problems.append(f"rank {dist.get_rank()} {name}: off by {diff:.3g} = {diff / max(scale, 1e-300):.3g} "
                            f"E_T > {ratio:.3g} E_T (E_T = {scale:.3g})")
    return worst, problems


def reduce_dtype_refused() -> str | None:
    """The sentence ``parallelize`` raises for a reduce_dtype given to a float64 model (None: accepted)."""
    dims = ParallelDims(1, 1, dist.get_world_size())
    try:
        parallelize(GPT().to(rank_device()), dims, groups=_groups(dims), reduce_dtype=torch.bfloat16)
    except ValueError as exc:
        return str(exc)
    return None
