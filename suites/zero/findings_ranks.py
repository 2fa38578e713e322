"""Rank side of test_findings.py: the minimal cases of third-party behaviour this suite found."""

from __future__ import annotations

import torch


def deepspeed_default_clipping(scale: float) -> dict:
    """One SGD step (momentum buffer = the gradient) of DeepSpeed stage 0 with the default config on a
    Linear(4, 1, bias=False) whose gradient is ``scale`` * (1, 1, 1, 1) (norm 2 * scale)."""
    from harness.adapters.deepspeed.zero import _init

    _init()
    import deepspeed

    model = torch.nn.Linear(4, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config={
        "train_micro_batch_size_per_gpu": 1, "steps_per_print": 1 << 30})
    loss = engine(torch.full((1, 4), scale)).sum()
    engine.backward(loss)
    engine.step()
    return {"grad_norm": 2 * scale, "applied_norm": float(opt.state[model.weight]["momentum_buffer"].norm())}
