"""The activation-checkpointing conformance case (inputs, oracle, check; in-process): a stack of
Linear-GELU-Dropout layers run with and without checkpointing from the same RNG seed."""

from __future__ import annotations

import copy

import torch
from torch import nn

from harness.errors import describe


def layers(count: int, hidden: int, dropout: float, seed: int, dtype) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(hidden, hidden, dtype=dtype), nn.GELU(), nn.Dropout(dropout))
            for _ in range(count)]


STEPS = 2
"""Consecutive training steps from one seed: the second sees whatever the first left behind (the caller's
RNG stream, parameters, optimizer state)."""


def run(module: nn.Module, x: torch.Tensor, seed: int, steps: int = STEPS) -> list[dict]:
    """Per step of SGD with momentum from ``seed``: output, input gradient and parameter gradients, then what
    the caller sees after the step — its RNG state, the parameters, the momentum buffers."""
    opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(seed)
    out = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        xi = x.detach().clone().requires_grad_(x.requires_grad)
        y = module(xi)
        y.pow(2).sum().backward()
        grads = [None if p.grad is None else p.grad.clone() for p in module.parameters()]
        opt.step()
        out.append({"output": y.detach(), "input": xi.grad, "params": grads, "rng": torch.get_rng_state(),
                    "weights": [p.detach().clone() for p in module.parameters()],
                    "momentum": [opt.state[p].get("momentum_buffer") for p in module.parameters()]})
    return out


def _same(a, b) -> bool:
    return (a is None) == (b is None) and (a is None or (a.shape == b.shape and torch.equal(a, b)))


def compare(impl, policy: str, count: int, hidden: int, dropout: float, dtype, input_grad: bool, seed: int):
    """Differences between ``impl.wrap(layers, policy)`` and the plain stack over ``STEPS`` consecutive steps:
    [] when everything is bitwise equal. Raises ``NotImplementedError`` (``Unsupported``) when the
    implementation does not provide ``policy``."""
    base = layers(count, hidden, dropout, seed, dtype)
    x = torch.randn(3, hidden, dtype=dtype, generator=torch.Generator().manual_seed(seed)).requires_grad_(input_grad)
    want = run(nn.Sequential(*copy.deepcopy(base)), x, seed + 1)
    wrapped = impl.wrap(copy.deepcopy(base), policy)  # Unsupported (NotImplementedError) goes to the caller
    try:
        got = run(wrapped, x, seed + 1)
    except Exception as exc:  # noqa: BLE001 - whatever the code under test raises is a verdict
        return [f"forward or backward raised {describe(exc)}"]
    problems = []
    for step, (w, g) in enumerate(zip(want, got, strict=True), start=1):
        for name in ("output", "input"):
            if not _same(w[name], g[name]):
                problems.append(f"step {step}: {name} differs")
        for i, (a, b) in enumerate(zip(w["params"], g["params"], strict=True)):
            if b is None or not _same(a, b):
                problems.append(f"step {step}: parameter {i} gradient {'missing' if b is None else 'differs'}")
        if not torch.equal(w["rng"], g["rng"]):
            problems.append(f"step {step}: the caller's RNG state after the step differs (the stream was not "
                            "left where the plain run leaves it)")
        for what in ("weights", "momentum"):
            if not all(_same(a, b) for a, b in zip(w[what], g[what], strict=True)):
                problems.append(f"step {step}: {what} after the optimizer step differ")
        if problems:
            break  # later steps only repeat the first difference
    return problems
