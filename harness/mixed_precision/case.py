"""The mixed-precision conformance case (rank side): ``reference.mixed_precision.MixedPrecisionZero`` at a
ZeRO stage, low-precision dtype and reduction dtype, against one device running the same recipe
(low-precision model, fp32 master and optimizer state) on the whole batch; the fp32 masters compared on
every rank, and the bytes each rank holds against ``cost_model.training_memory``."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

from reference.mixed_precision import DynamicLossScaler, MixedPrecisionZero
from reference.models import mlp
from reference.zero import OptimizerSpec, held_bytes
from reference.zero.accounting import optimizer_state_tensors

SIZES = (16, 32, 16)
"""1,072 parameters; each layer's count divides by 8, so no ZeRO shard is padded at N = 2, 4, 8."""
LR = 0.05
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def bound(steps: int, n: int, dtype: torch.dtype, g_max: float) -> float:
    """Largest allowed absolute difference of an fp32 master from one device's.

    Rank r computes g_r, the mean-loss gradient of its slice, rounded once to the low precision (unit
    roundoff u); the group averages them in fp32 or in the low precision ((n - 1) more roundings) and
    rounds the mean to the low precision; one device rounds the whole batch's gradient once. Forward
    passes are row-wise, the same on both sides. Per element |dg| <= (n + 1) u (1/n) sum_r |g_r| <=
    (n + 1) u G, G the largest |g_r| (the oracle computes every slice's gradient); masters that differ by
    less than a low-precision ULP may round to parameters one ULP apart, which moves the next gradient
    by about depth u G (depth 4: two layers, forward and backward): (n + 5) u G per step. SGD's momentum
    carries a step's gradient into later updates with weights 1, 0.9, 0.81, ...: after t steps the
    gradient differences have moved a master by at most lr (n + 5) u G sum_{s<=t} (1 - 0.9^s) / 0.1.
    A missing average moves a master by ~ (n - 1) lr G per step: measured 16x this bound and more."""
    u = torch.finfo(dtype).eps / 2
    carried = sum((1 - 0.9**s) / 0.1 for s in range(1, steps + 1))
    return LR * carried * (n + 5) * u * g_max


def _slice_grad_max(model, slices, loss_of) -> float:
    """The largest |gradient| of ``loss_of(xs, ys)`` over every rank's slice: the G of ``bound``."""
    g_max = 0.0
    for xs, ys in slices:
        model.zero_grad()
        loss_of(xs, ys).backward()
        g_max = max(g_max, max(float(p.grad.float().abs().max()) for p in model.parameters()))
    return g_max


def _one_device(model, x, y, slices, steps: int, scaler, spec: OptimizerSpec, master: bool = True,
                fp32_loss: bool = False):
    """The same recipe on one device; also the largest |gradient| of any rank's slice at any step.
    ``master`` False: no fp32 copy — the optimizer steps the low-precision parameters themselves.
    ``fp32_loss``: the loss is scaled in fp32 (``loss.float() * scale``, DeepSpeed's and autocast's way),
    so only the gradients can overflow; else in the low precision, where the scaled loss itself can."""
    if not master:
        return _pure_low_precision(model, x, y, slices, steps, spec)
    masters = [torch.nn.Parameter(p.detach().float().clone()) for p in model.parameters()]
    opt = spec.build(masters)
    g_max = 0.0
    for _ in range(steps):
        g_max = max(g_max, _slice_grad_max(model, slices, lambda xs, ys: F.mse_loss(model(xs), ys)))
        model.zero_grad()
        scale = scaler.scale if scaler is not None else 1.0
        loss = F.mse_loss(model(x), y)
        ((loss.float() if fp32_loss else loss) * scale).backward()
        for m, p in zip(masters, model.parameters(), strict=True):
            m.grad = p.grad.float() / scale
        if scaler is not None and not scaler.update_from([m.grad for m in masters], {}):
            continue
        opt.step()
        with torch.no_grad():
            for m, p in zip(masters, model.parameters(), strict=True):
                p.copy_(m.to(p.dtype))
    return [m.detach() for m in masters], g_max


def _one_device_autocast(model, x, y, slices, steps: int, scaler, spec: OptimizerSpec):
    """torch AMP's recipe on one device: the fp32 ``model`` (the masters) run under
    ``torch.autocast(float16)`` (GEMMs in fp16, the loss in fp32), the loss scaled, the fp32 gradients
    unscaled, a step with an inf / NaN skipped; the largest |gradient| of any slice, for ``bound``."""
    params, device = list(model.parameters()), x.device.type
    opt, g_max = spec.build(params), 0.0

    def loss_of(xs, ys):
        with torch.autocast(device, dtype=torch.float16):
            return F.mse_loss(model(xs.float()), ys.float())

    for _ in range(steps):
        g_max = max(g_max, _slice_grad_max(model, slices, loss_of))
        model.zero_grad()
        (loss_of(x, y) * scaler.scale).backward()
        for p in params:
            p.grad.div_(scaler.scale)  # a power of two: exact
        if scaler.update_from([p.grad for p in params], {}):
            opt.step()
    return [p.detach().clone() for p in params], g_max


def _pure_low_precision(model, x, y, slices, steps: int, spec: OptimizerSpec):
    opt, g_max = spec.build(model.parameters()), 0.0
    for _ in range(steps):
        g_max = max(g_max, _slice_grad_max(model, slices, lambda xs, ys: F.mse_loss(model(xs), ys)))
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().float() for p in model.parameters()], g_max


def inputs(n: int, per_rank: int, seed: int, dtype: torch.dtype):
    """The low-precision model (seeded), the global batch, and each rank's slice."""
    torch.manual_seed(seed)
    model = mlp(SIZES, dtype=dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(n * per_rank, SIZES[0], generator=gen).to(dtype)
    y = torch.randn(n * per_rank, SIZES[-1], generator=gen).to(dtype)
    return model, x, y, [(x[k * per_rank:(k + 1) * per_rank], y[k * per_rank:(k + 1) * per_rank]) for k in range(n)]


def compare(got: list, want: list, limit: float) -> tuple[float, list[str]]:
    """(largest absolute difference, one line per parameter off by more than ``limit``)."""
    diffs = [float((a.float() - b).abs().max()) for a, b in zip(got, want, strict=True)]
    return max(diffs), [f"rank {dist.get_rank()}: parameter {i} off by {d:.3g} > {limit:.3g}"
                        for i, d in enumerate(diffs) if not d <= limit]


def train_mixed(stage: int, dtype_name: str, reduce_name: str, steps: int = 3, per_rank: int = 4, seed: int = 0,
                init_scale: float | None = None, planted: str | None = None, optimizer: str = "sgd") -> dict:
    """``reduce_name``: "float32" or "low". ``init_scale``: a dynamic loss scaler (fp16's) starting there,
    growing every 2 clean steps; its state must match one device's. ``planted``: "missing-average" (the
    reduced gradient summed, not averaged). ``optimizer`` "adam": K = 12 bytes of fp32 state per parameter
    (the memory table); its masters are not held to ``bound`` (derived for SGD: Adam's normalisation
    divides a rounding difference by sqrt(v) + eps) — ``checked`` is False. These trainers' bf16 with Adam is held in
    the stack suite instead, per step against one device's E_T with the masters replayed as Adam's step of their own
    state (harness/stack/mixed.py, adam_replay.py): the reference's MixedPrecisionZero, FSDP2's MixedPrecisionPolicy
    (the torch stack, torchtitan) and DeepSpeed's bf16 at ZeRO 0-3."""
    n, r = dist.get_world_size(), dist.get_rank()
    dtype = DTYPES[dtype_name]
    model, x, y, slices = inputs(n, per_rank, seed, dtype)
    scaler = (lambda: DynamicLossScaler(init_scale, growth_interval=2)) if init_scale else (lambda: None)
    single_scaler = scaler()
    spec = OptimizerSpec(optimizer, LR)
    want, g_max = _one_device(copy.deepcopy(model), x, y, slices, steps, single_scaler, spec)
    trainer = MixedPrecisionZero(model, spec, stage,
                                 reduce_dtype=torch.float32 if reduce_name == "float32" else dtype,
                                 loss_scaler=scaler())
    memory = {}
    for _ in range(steps):
        trainer.zero_grad()
        (F.mse_loss(model(slices[r][0]), slices[r][1]) * trainer.scale).backward()
        trainer.reduce()
        if planted == "missing-average":
            for g in trainer.grads:
                g.mul_(n)
        memory = {"params": held_bytes(list(model.parameters()) + trainer.parts),
                  "grads": held_bytes(trainer.held_grads()),
                  "optimizer": held_bytes(trainer.masters + optimizer_state_tensors(trainer.optimizer))}
        trainer.update()
    memory["optimizer"] = held_bytes(trainer.masters + optimizer_state_tensors(trainer.optimizer))
    got = trainer.full_masters()
    limit = bound(steps, n, dtype, g_max)
    checked = optimizer == "sgd"
    worst, problems = compare(got, want, limit)
    problems = problems if checked else []
    if single_scaler is not None and trainer.loss_scaler.state_dict() != single_scaler.state_dict():
        problems.append(f"rank {r}: loss scaler {trainer.loss_scaler.state_dict()} != one device's "
                        f"{single_scaler.state_dict()}")
    return {"worst": worst, "bound": limit, "problems": problems, "memory": memory, "checked": checked,
            "numel": sum(p.numel() for p in want),
            "scaler": trainer.loss_scaler.state_dict() if single_scaler is not None else None}
