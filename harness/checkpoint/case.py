"""The activation-checkpointing conformance case (inputs, oracle, check; in-process): a stack of
Linear-GELU-Dropout layers run with and without checkpointing from the same RNG seed."""

from __future__ import annotations

import copy

import torch
from torch import nn


def layers(count: int, hidden: int, dropout: float, seed: int, dtype) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(hidden, hidden, dtype=dtype), nn.GELU(), nn.Dropout(dropout))
            for _ in range(count)]


def run(module: nn.Module, x: torch.Tensor, seed: int) -> dict:
    """Output, input gradient and parameter gradients of one forward + backward from ``seed``."""
    x = x.detach().clone().requires_grad_(x.requires_grad)
    torch.manual_seed(seed)
    out = module(x)
    out.pow(2).sum().backward()
    return {"output": out.detach(), "input": x.grad,
            "params": [None if p.grad is None else p.grad.clone() for p in module.parameters()]}


def compare(impl, policy: str, count: int, hidden: int, dropout: float, dtype, input_grad: bool, seed: int):
    """Differences between ``impl.wrap(layers, policy)`` and the plain stack: [] when bitwise equal.
    Raises ``NotImplementedError`` (``Unsupported``) when the implementation does not provide ``policy``."""
    base = layers(count, hidden, dropout, seed, dtype)
    x = torch.randn(3, hidden, dtype=dtype, generator=torch.Generator().manual_seed(seed)).requires_grad_(input_grad)
    want = run(nn.Sequential(*copy.deepcopy(base)), x, seed + 1)
    wrapped = impl.wrap(copy.deepcopy(base), policy)  # Unsupported (NotImplementedError) goes to the caller
    try:
        got = run(wrapped, x, seed + 1)
    except RuntimeError as exc:
        return [f"forward or backward raised: {str(exc).splitlines()[0]}"]
    problems = []
    for name in ("output", "input"):
        if (want[name] is None) != (got[name] is None) or (want[name] is not None
                                                             and not torch.equal(want[name], got[name])):
            problems.append(f"{name} differs")
    for i, (w, g) in enumerate(zip(want["params"], got["params"], strict=True)):
        if g is None or not torch.equal(w, g):
            problems.append(f"parameter {i} gradient {'missing' if g is None else 'differs'}")
    return problems
