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


def torch_fp16_resumed(directory: str) -> dict:
    """The torch stack in float16 over dp 2 (FSDP2, ZeRO 2), the loss scale from 2^16 growing every clean step:
    three steps, ``save``; a second trainer ``load``s it; both take two more steps. Returns each one's GradScaler
    state_dict after the load and after the steps, their losses, and the largest difference of their dense states
    (params and optimizer state)."""
    from harness.adapters.torch.stack import TorchStack
    from harness.stack.inputs import flat_state, global_batch, rows_for, seq_for
    from reference.models import ModelSpec
    from suites._support.stack import GPT

    spec = ModelSpec(**{**GPT.as_dict(), "dtype": "float16"})
    layout, recipe = Layout(2, 1, 1, zero=2), Recipe(loss_scale=2.0**16, growth_interval=1)
    tokens, targets = global_batch(spec.vocab, rows_for(layout, recipe), 0, seq_for(layout))
    first = TorchStack().build(spec, layout, recipe)
    first.load_dense(spec.build(0).state_dict())
    losses = [first.step(tokens, targets) for _ in range(3)]
    first.save(directory)
    second = TorchStack().build(spec, layout, recipe)
    second.load_dense(spec.build(0).state_dict())
    second.load(directory)

    def scaler(trainer) -> dict:
        return trainer.trainer.scaler.state_dict()

    out = {"saved": scaler(first), "loaded": scaler(second), "losses": losses}
    out["after"] = [[t.step(tokens, targets) for _ in range(2)] for t in (first, second)]
    out["scales_after"] = [scaler(first), scaler(second)]
    states = [t.dense_state() for t in (first, second)]
    flat = [{**s["params"], **flat_state(s["optimizer"])} for s in states]
    out["off"] = max(float((flat[0][k].double() - flat[1][k].double()).abs().max()) for k in flat[0])
    return out
