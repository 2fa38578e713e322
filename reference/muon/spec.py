"""Muon's hyper-parameters, which parameters it takes, and the one-device oracle.

The rule (Keller Jordan's, Moonlight's, torch's documentation): Muon takes the hidden layers' weight matrices; the
embedding, the LM head and every vector (norms, biases) train with AdamW. A fused matrix — QKV, gate + up — is
orthogonalised per logical part (its row blocks ``parts``), each part's learning rate adjusted by its own shape, as
the unfused layers would be (Megatron's and Moonlight's Muon split them; a fused one orthogonalised whole is another
optimizer)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

import torch

from .newton_schulz import COEFFICIENTS, EPS, STEPS, newton_schulz


@dataclass(frozen=True)
class MuonSpec:
    lr: float = 0.02
    momentum: float = 0.95
    nesterov: bool = True
    weight_decay: float = 0.1
    ns_steps: int = STEPS
    adjust_lr_fn: str | None = None
    """torch's: None / "original" (sqrt(max(1, A / B))), "match_rms_adamw" (0.2 sqrt(max(A, B))) or, from torch 2.15,
    "spectral_unclamped" (sqrt(A / B): Bernstein's; ``torch_adjusts``)."""
    adamw_lr: float = 1e-3
    adamw_betas: tuple = (0.9, 0.999)
    adamw_eps: float = 1e-8
    adamw_weight_decay: float = 0.01
    adamw_names: tuple = ("embed", "head")
    """Matrices by name that are not hidden layers (AdamW's)."""
    parts: dict = field(default_factory=dict)
    """name -> the row counts of a fused matrix's logical parts (QKV: q, k, v rows)."""

    def takes(self, name: str, shape) -> bool:
        """Muon's parameter: a 2-D hidden-layer matrix."""
        return len(shape) == 2 and not any(a in name for a in self.adamw_names)

    def part_rows(self, name: str, rows: int) -> tuple:
        parts = tuple(self.parts.get(name, (rows,)))
        if sum(parts) != rows:
            raise ValueError(f"the parts {parts} of {name} do not add up to its {rows} rows.")
        return parts

    def adjusted_lr(self, shape) -> float:
        a, b = shape[:2]
        if self.adjust_lr_fn in (None, "original"):
            return self.lr * math.sqrt(max(1, a / b))
        if self.adjust_lr_fn == "match_rms_adamw":
            return self.lr * 0.2 * math.sqrt(max(a, b))
        if self.adjust_lr_fn == "spectral_unclamped":
            return self.lr * math.sqrt(a / b)
        raise ValueError("adjust_lr_fn must be None, 'original', 'match_rms_adamw' or 'spectral_unclamped'; got "
                         f"{self.adjust_lr_fn!r}.")

    def adamw(self, params) -> torch.optim.AdamW:
        return torch.optim.AdamW(params, lr=self.adamw_lr, betas=self.adamw_betas, eps=self.adamw_eps,
                                 weight_decay=self.adamw_weight_decay, foreach=False)


def at_lr(spec: MuonSpec, lr: float) -> MuonSpec:
    """``spec`` stepping at ``lr`` — its group's, which a learning-rate scheduler sets: torch's Muon reads the group's
    lr at each step for both the decay (1 - lr x wd) and the adjusted lr."""
    return spec if lr == spec.lr else replace(spec, lr=lr)


def orthogonalised(spec: MuonSpec, name: str, update: torch.Tensor, dtype=torch.bfloat16) -> list:
    """[(rows slice, NS of that part, its adjusted lr)] of a whole matrix's update, per logical part."""
    out, start = [], 0
    for rows in spec.part_rows(name, update.shape[0]):
        part = update[start:start + rows]
        out.append((slice(start, start + rows),
                    newton_schulz(part, spec.ns_steps, COEFFICIENTS, EPS, dtype), spec.adjusted_lr(part.shape)))
        start += rows
    return out


def muon_update(spec: MuonSpec, grad: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    """torch's momentum: the buffer lerped toward the gradient, the update Nesterov's (or the buffer), in place."""
    buf.lerp_(grad, 1 - spec.momentum)
    return grad.lerp(buf, spec.momentum) if spec.nesterov else buf


def apply(spec: MuonSpec, param: torch.Tensor, name: str, update: torch.Tensor, dtype=torch.bfloat16) -> None:
    """``param`` (the whole matrix) stepped by the whole ``update``, as torch's Muon steps one matrix per part."""
    param.mul_(1 - spec.lr * spec.weight_decay)
    for rows, ortho, lr in orthogonalised(spec, name, update, dtype):
        param[rows].add_(ortho, alpha=-lr)


def one_device(params: dict, grads: list, spec: MuonSpec, dtype=torch.bfloat16) -> list:
    """The oracle: ``params`` (name -> tensor) stepped once per entry of ``grads`` (each name -> whole gradient),
    Muon's matrices by torch's algorithm (Newton-Schulz in ``dtype``), the rest by torch's AdamW; returns the
    parameters after each step (copies, in ``params``' dtype)."""
    params = {k: v.detach().clone() for k, v in params.items()}
    muon = {k for k, v in params.items() if spec.takes(k, v.shape)}
    bufs = {k: torch.zeros_like(params[k]) for k in muon}
    rest = [params[k] for k in params if k not in muon]
    adamw = spec.adamw(rest) if rest else None
    out = []
    for step in grads:
        for k in muon:
            apply(spec, params[k], k, muon_update(spec, step[k].to(params[k].dtype), bufs[k]), dtype)
        if adamw:
            for k in params:
                if k not in muon:
                    params[k].grad = step[k].to(params[k].dtype)
            adamw.step()
        out.append({k: v.clone() for k, v in params.items()})
    return out


@functools.cache
def torch_adjusts(adjust_lr_fn: str | None) -> bool:
    """Whether the installed ``torch.optim.Muon`` takes ``adjust_lr_fn`` (torch 2.15 added "spectral_unclamped"):
    asked of torch itself — it refuses one it lacks at construction."""
    try:
        torch.optim.Muon([torch.nn.Parameter(torch.zeros(2, 2))], adjust_lr_fn=adjust_lr_fn)
    except ValueError:
        return False
    return True


def torch_lacks(adjust_lr_fn: str | None) -> str | None:
    """The sentence where torch's Muon lacks ``adjust_lr_fn``; None where it has it."""
    if torch_adjusts(adjust_lr_fn):
        return None
    return (f"torch {torch.__version__}'s Muon has no adjust_lr_fn {adjust_lr_fn!r} (torch 2.15 added "
            "'spectral_unclamped').")
