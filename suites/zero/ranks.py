"""Rank side of the data-parallel / ZeRO suite: one implementation trained on this rank's slice of a
global batch, against one device trained on the whole batch (computed on every rank, same seed)."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

from reference.models import TransformerBlock, mlp
from reference.zero import OptimizerSpec

LR = {"sgd": 0.05, "adam": 0.01}


def build_model(name: str, seed: int, dtype: str) -> torch.nn.Module:
    torch.manual_seed(seed)
    dt = getattr(torch, dtype)
    return mlp(dtype=dt) if name == "mlp" else TransformerBlock(dtype=dt)


def global_batch(name: str, batch: int, seed: int, dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1)
    dt = getattr(torch, dtype)
    shape_in, shape_out = ((batch, 4), (batch, 3)) if name == "mlp" else ((batch, 3, 8), (batch, 3, 8))
    return torch.randn(shape_in, generator=g, dtype=dt), torch.randn(shape_out, generator=g, dtype=dt)


def _single_device(model, spec, x, y, steps: int) -> list[dict]:
    """One device, whole batch: after each step the loss, params, grads and optimizer state."""
    opt = spec.build(model.parameters())
    out = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        out.append({"loss": float(loss),
                    "params": {k: p.detach().clone() for k, p in model.named_parameters()},
                    "grads": {k: p.grad.clone() for k, p in model.named_parameters()},
                    "state": {k: {s: opt.state[p][s].clone() for s in spec.state_keys}
                              for k, p in model.named_parameters()}})
    return out


def train_case(impl_spec: str, stage: int, model_name: str, opt_name: str, steps: int, per_rank: int,
               seed: int, dtype: str = "float64") -> dict:
    from harness import registry

    n, r = dist.get_world_size(), dist.get_rank()
    spec = OptimizerSpec(opt_name, LR[opt_name])
    model = build_model(model_name, seed, dtype)
    x, y = global_batch(model_name, n * per_rank, seed, dtype)
    want = _single_device(copy.deepcopy(model), spec, x, y, steps)
    impl = registry.load(impl_spec, "zero")
    try:
        trainer = impl.build(copy.deepcopy(model), spec, stage, None)
    except ValueError as exc:
        return {"refused": str(exc), "unsupported": False}
    except NotImplementedError as exc:
        return {"refused": str(exc), "unsupported": True}
    mine = slice(r * per_rank, (r + 1) * per_rank)
    checks = []
    for k in range(steps):
        local = torch.tensor([trainer.step(x[mine], y[mine])], dtype=torch.float64)
        dist.all_reduce(local)
        if k in (0, steps - 1):
            checks.append(_compare(k + 1, float(local) / n, trainer, want[k], n * per_rank, n, dtype))
    return {"refused": None, "checks": checks, "memory": trainer.memory(),
            "numel": sum(p.numel() for p in model.parameters())}


def _compare(step: int, loss: float, trainer, want: dict, batch: int, n: int, dtype: str) -> dict:
    """Largest difference of each quantity, relative to that tensor's own largest magnitude."""
    got = {"params": trainer.full_params(), "grads": trainer.full_grads(),
           "state": trainer.full_optimizer_state()}
    worst = {"loss": abs(loss - want["loss"]) / max(abs(want["loss"]), 1e-300)}
    problems = []
    for what in ("params", "grads"):
        for name, w in want[what].items():
            g = got[what].get(name)
            if g is None or g.shape != w.shape:
                problems.append(f"{what} {name}: missing or shape {None if g is None else tuple(g.shape)}")
                continue
            worst[f"{what} {name}"] = float((g.double() - w.double()).abs().max() / max(float(w.abs().max()), 1e-300))
    for name, states in want["state"].items():
        for key, w in states.items():
            g = got["state"].get(name, {}).get(key)
            if g is None or g.shape != w.shape:
                problems.append(f"state {name}.{key}: missing or shape {None if g is None else tuple(g.shape)}")
                continue
            worst[f"state {name}.{key}"] = float((g.double() - w.double()).abs().max()
                                                 / max(float(w.abs().max()), 1e-300))
    return {"step": step, "worst": worst, "problems": problems}
