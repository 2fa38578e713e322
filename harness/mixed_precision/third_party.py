"""Third-party mixed precision against one device running the same recipe (``case._one_device``), data
parallel over the World, every rank's parameters compared within ``case.bound``:

- ``fsdp2``: ``fully_shard(mp_policy=MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32))`` — the
  sharded fp32 parameters are the master weights, compute in bf16, reduce-scatter in fp32 (stage 2:
  reshard_after_forward False, stage 3: True);
- ``ddp-bf16``: DDP over a bf16 model (no master: the optimizer steps bf16 parameters; one device does
  the same), gradients all-reduced in bf16; stage 1: with ``ZeroRedundancyOptimizer`` (torch's ZeRO 1);
- ``fsdp2-fp16``: the same with ``param_dtype=fp16`` and ``torch.amp.GradScaler`` (FSDP2's documented
  fp16 recipe: the plain GradScaler, whose inf check on the sharded DTensor gradients is reduced over the
  mesh by DTensor's ``found_inf_reduce_handler`` — over the dimensions the first gradient is sharded on: on this
  1-D dp mesh every one; over tp not always, a torch finding: suites/tensor_parallel/test_findings.py);
- ``ddp-amp-fp16``: torch AMP — an fp32 model (the masters) under ``torch.autocast(float16)``, DDP,
  ``torch.amp.GradScaler``; one device runs the same autocast recipe (``case._one_device_autocast``);
- ``deepspeed``: ``bf16: {enabled: true}`` at ZeRO stage 0-3 (its fp32 master read with
  ``safe_get_full_fp32_param``; at stage 0 DeepSpeed 0.19 wraps the optimizer in FP16_UnfusedOptimizer,
  whose ``fp32_groups`` are the masters).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

from harness.contracts import Unsupported
from harness.errors import describe
from harness.runtime import capabilities
from harness.runtime.rank import rank_device
from reference.mixed_precision import DynamicLossScaler
from reference.zero import OptimizerSpec

from . import case


class _TorchScaler:
    """``torch.amp.GradScaler`` (torch's rule = ``DynamicLossScaler``'s: from 2^init_power, growing every 2
    clean steps) driving ``opt``; counts the steps it skipped (the scale backed off)."""

    def __init__(self, opt, init_power: int):
        self.opt, self.skipped = opt, 0
        self.torch = torch.amp.GradScaler(rank_device().type, init_scale=2.0**init_power, growth_interval=2)

    def step(self, loss) -> None:
        before = self.torch.get_scale()
        self.torch.scale(loss).backward()
        self.torch.step(self.opt)
        self.torch.update()
        self.skipped += self.torch.get_scale() < before

    def state(self) -> dict:
        return {"scale": float(self.torch.get_scale()), "skipped": self.skipped}


def _fsdp2(model, stage: int, fp16: bool = False, init_power: int = 18):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = DeviceMesh.from_group(dist.group.WORLD, rank_device().type)
    policy = MixedPrecisionPolicy(param_dtype=torch.float16 if fp16 else torch.bfloat16, reduce_dtype=torch.float32)
    model = model.float()  # the fp32 masters: the bf16 values, exactly
    for module in list(model.modules())[1:]:
        if next(module.parameters(recurse=False), None) is not None:
            fully_shard(module, mesh=mesh, reshard_after_forward=stage == 3, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=stage == 3, mp_policy=policy)
    opt = OptimizerSpec("sgd", case.LR).build(model.parameters())
    scaler = _TorchScaler(opt, init_power) if fp16 else None

    def step(xs, ys):
        opt.zero_grad()
        loss = F.mse_loss(model(xs.float()), ys)
        if scaler is not None:
            return scaler.step(loss)
        loss.backward()
        opt.step()

    def params():
        return [p.detach().full_tensor() for p in model.parameters()]

    if scaler is not None:
        params.scaler = scaler.state
    return step, params


def _fsdp2_fp16(model, stage: int, init_power: int = 18):
    return _fsdp2(model, stage, fp16=True, init_power=init_power)


def _ddp_amp_fp16(model, stage: int, init_power: int = 18):
    from torch.nn.parallel import DistributedDataParallel

    model = model.float()  # the fp32 masters: the fp16 values, exactly
    ddp = DistributedDataParallel(model)
    opt = OptimizerSpec("sgd", case.LR).build(model.parameters())
    scaler = _TorchScaler(opt, init_power)

    def step(xs, ys):
        opt.zero_grad()
        with torch.autocast(rank_device().type, dtype=torch.float16):
            loss = F.mse_loss(ddp(xs.float()), ys.float())
        scaler.step(loss)

    def params():
        return [p.detach() for p in model.parameters()]

    params.scaler = scaler.state
    return step, params


def _ddp_bf16(model, stage: int):
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(model)
    spec = OptimizerSpec("sgd", case.LR)
    if stage == 1:  # torch's ZeRO 1: each rank steps its partition of the bf16 parameters, then broadcasts it
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=spec.lr,
                                      momentum=spec.momentum)
    else:
        opt = spec.build(model.parameters())

    def step(xs, ys):
        opt.zero_grad()
        F.mse_loss(ddp(xs), ys).backward()
        opt.step()

    return step, lambda: [p.detach().float() for p in model.parameters()]


def _deepspeed(model, stage: int, fp16: bool = False, init_power: int = 18):
    from harness.adapters.deepspeed.zero import _init

    _init()
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param

    # fp16: DeepSpeed's dynamic loss scaler set to the reference's rule (start 2^18, halve on an overflow
    # at once — hysteresis 1 —, double after 2 clean steps)
    precision = ({"fp16": {"enabled": True, "initial_scale_power": init_power, "loss_scale_window": 2, "hysteresis": 1,
                           "min_loss_scale": 1}} if fp16 else {"bf16": {"enabled": True}})
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              **precision, "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
              "zero_allow_untested_optimizer": True, "steps_per_print": 1 << 30}
    reason = capabilities.deepspeed_dtype_unsupported(torch.float16 if fp16 else torch.bfloat16)
    if reason:
        raise Unsupported(reason)
    model = model.float()
    engine, opt, _, _ = deepspeed.initialize(model=model, config=config,
                                             optimizer=OptimizerSpec("sgd", case.LR).build(model.parameters()))

    def step(xs, ys):
        loss = F.mse_loss(engine(xs), ys)
        engine.backward(loss)
        engine.step()

    def params():
        if stage == 0:  # FP16_UnfusedOptimizer (bf16 at ZeRO 0): its fp32 masters, in parameter order
            return [m.detach() for group in opt.fp32_groups for m in group]
        return [safe_get_full_fp32_param(p) for p in engine.module.parameters()]

    def scaler():
        holder = opt.loss_scaler if hasattr(opt, "loss_scaler") else opt.loss_scale_config  # ZeRO 1-3 / 0
        return {"scale": float(holder.cur_scale), "skipped": int(engine.skipped_steps)}

    params.scaler = scaler
    return step, params


class DeepSpeedRule(DynamicLossScaler):
    """DeepSpeed 0.19's growth rule (runtime/fp16/loss_scaler.py, unfused_optimizer.py): after an overflow
    at iteration k the scale doubles at iteration i when (i - k - 1) > 0 and (i - k - 1) % window == 0 — the
    first growth after window + 1 clean steps (a run starts as if iteration -1 overflowed); torch's
    GradScaler, and ``DynamicLossScaler``, grow after ``growth_interval`` clean steps."""

    def __init__(self, init_scale: float, window: int):
        super().__init__(init_scale, growth_interval=window)
        self.iteration, self.last_overflow = 0, -1

    def update(self, found_inf: bool) -> bool:
        if found_inf:
            self.scale, self.last_overflow = max(self.scale * self.backoff_factor, self.min_scale), self.iteration
            self.skipped += 1
        else:
            stable = self.iteration - self.last_overflow - 1
            if stable > 0 and stable % self.growth_interval == 0:
                self.scale *= self.growth_factor
        self.iteration += 1
        return not found_inf


def deepspeed_capability_and_engine(dtype_name: str) -> tuple[str | None, str | None]:
    """Rank side, the capability's watch: (our capability check's reason, the error DeepSpeed's engine raises
    when it is initialised in ``dtype_name`` at ZeRO 1 anyway) — both None where the machine runs it."""
    from harness.adapters.deepspeed.zero import _init

    _init()
    import deepspeed

    dtype = getattr(torch, dtype_name)
    key = "fp16" if dtype == torch.float16 else "bf16"
    model = torch.nn.Linear(2, 2)
    config = {"train_micro_batch_size_per_gpu": 1, key: {"enabled": True}, "zero_optimization": {"stage": 1},
              "zero_allow_untested_optimizer": True, "steps_per_print": 1 << 30}
    try:
        deepspeed.initialize(model=model, config=config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        engine = None
    except ValueError as exc:
        engine = describe(exc)
    return capabilities.deepspeed_dtype_unsupported(dtype), engine


def _deepspeed_fp16(model, stage: int, init_power: int = 18):
    return _deepspeed(model, stage, fp16=True, init_power=init_power)


STACKS = {"fsdp2": (_fsdp2, (2, 3), True), "ddp-bf16": (_ddp_bf16, (0, 1), False),
          "fsdp2-fp16": (_fsdp2_fp16, (2, 3), True), "ddp-amp-fp16": (_ddp_amp_fp16, (0,), True),
          "deepspeed": (_deepspeed, (0, 1, 2, 3), True), "deepspeed-fp16": (_deepspeed_fp16, (0, 1, 2, 3), True)}
"""name -> (builder, stages, whether it keeps fp32 master weights)."""


def train_stack(stack: str, stage: int, steps: int = 3, per_rank: int = 4, seed: int = 0,
                init_power: int = 18) -> dict:
    """``stack`` at ``stage`` in bf16 against one device's same recipe: every rank's parameters (the fp32
    masters where the stack keeps them) within ``case.bound`` (+ one bf16 ULP of the largest parameter
    per step where the stack has no master: its update rounds in bf16 on both sides)."""
    build, stages, master = STACKS[stack]
    n, r = dist.get_world_size(), dist.get_rank()
    dtype = torch.float16 if stack.endswith("fp16") else torch.bfloat16
    reason = capabilities.dtype_unsupported(dtype, rank_device())
    if reason:
        return unsupported(reason)
    model, x, y, slices = case.inputs(n, per_rank, seed, dtype)
    spec = OptimizerSpec("sgd", case.LR)
    # fp16: the stack's own scaler rule, from 2^init_power: the same recipe
    scaler = None if dtype != torch.float16 else (DeepSpeedRule(2.0**init_power, 2) if stack.startswith("deepspeed")
                                                  else DynamicLossScaler(2.0**init_power, growth_interval=2))
    if stack == "ddp-amp-fp16":
        want, g_max = case._one_device_autocast(copy.deepcopy(model).float(), x, y, slices, steps, scaler, spec)
    else:
        want, g_max = case._one_device(copy.deepcopy(model), x, y, slices, steps, scaler, spec, master=master,
                                       fp32_loss=True)
    limit = case.bound(steps, n, dtype, g_max)
    if not master:
        limit += steps * torch.finfo(torch.bfloat16).eps * max(float(w.abs().max()) for w in want)
    try:
        step, params = build(model, stage, init_power) if dtype == torch.float16 else build(model, stage)
    except NotImplementedError as exc:  # Unsupported: what this machine (or the stack) does not run
        return unsupported(str(exc))
    except Exception as exc:  # noqa: BLE001 - the stack's own failure is a verdict
        return {"error": describe(exc), "problems": [f"raised {describe(exc)}"], "worst": float("inf"), "bound": limit}
    try:
        for _ in range(steps):
            step(*slices[r])
        got = params()
        theirs = params.scaler() if scaler is not None else None
    except Exception as exc:  # noqa: BLE001 - the stack's own failure is a verdict
        return {"error": describe(exc), "problems": [f"raised {describe(exc)}"], "worst": float("inf"), "bound": limit}
    worst, problems = case.compare(got, want, limit)
    mine = {"scale": scaler.scale, "skipped": scaler.skipped} if scaler is not None else None
    if theirs != mine:
        problems.append(f"rank {r}: loss scaler {theirs} != one device's {mine}")
    return {"error": None, "problems": problems, "worst": worst, "bound": limit, "scaler": theirs}


def unsupported(reason: str) -> dict:
    """A case this machine or stack cannot run: no problems, no figures, the reason."""
    return {"unsupported": reason, "error": None, "problems": [], "worst": float("nan"), "bound": float("nan")}
