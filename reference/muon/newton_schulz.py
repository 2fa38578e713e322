"""The Newton-Schulz orthogonalisation of Muon, as torch 2.13's ``torch.optim.Muon`` computes it (Keller Jordan's
quintic iteration: a, b, c = 3.4445, -4.7750, 2.0315, five steps, the matrix first divided by its Frobenius norm and
taken wide), in ``dtype`` — torch's is bfloat16; float64 is exact arithmetic's stand-in (the suite's E_T)."""

from __future__ import annotations

import torch

COEFFICIENTS = (3.4445, -4.7750, 2.0315)
STEPS = 5
EPS = 1e-7


def newton_schulz(g: torch.Tensor, steps: int = STEPS, coefficients: tuple = COEFFICIENTS, eps: float = EPS,
                  dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """U S' V^T of a 2-D ``g`` (S' ~ 1): ``steps`` quintic iterations in ``dtype``, returned in ``dtype``."""
    if g.dim() != 2:
        raise ValueError(f"Newton-Schulz orthogonalises a matrix; got a tensor of shape {tuple(g.shape)}.")
    a, b, c = coefficients
    x = g.to(dtype)
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x = x.div(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x
