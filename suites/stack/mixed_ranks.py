"""Rank side of the third-party stacks' bf16 checks: what the precision-matched bound cannot see. An fp32 run is
nearer exact than one device's bf16, so it passes that bound too — these say the stack's model really is bf16
and what its dense state reports are fp32 masters that hold values bf16 cannot."""

from __future__ import annotations

import torch

from harness.contracts.stack import Layout, Recipe


def bf16_report(stack, spec, model_params, layout: Layout | None = None) -> tuple[set, set, bool]:
    """(the model's parameter dtypes, the reported masters' dtypes, whether a master holds a value bf16 cannot)
    after one step of ``stack`` (a built-in stack object) on ``layout`` (default one rank, ZeRO 0);
    ``model_params(trainer)`` gives the stack's own model parameters."""
    trainer = stack.build(spec, layout or Layout(1, 1, 1), Recipe())
    trainer.load_dense(spec.build(0).state_dict())
    tokens = torch.randint(0, spec.vocab, (2, 4), generator=torch.Generator().manual_seed(0))
    trainer.step(tokens, tokens)
    masters = list(trainer.dense_state()["params"].values())
    return ({str(p.dtype) for p in model_params(trainer)}, {str(m.dtype) for m in masters},
            any(bool((m != m.bfloat16().float()).any()) for m in masters))


EXPECTED = ({"torch.bfloat16"}, {"torch.float32"}, True)
