"""DeepSpeed's own checkpoints (``engine.save_checkpoint`` / ``load_checkpoint``) across a resume: saved
at one (world size, ZeRO stage), loaded at another, trained on, against one device — the data-parallel
suite's model (``mlp``, float32, SGD with momentum) and bound. Whatever DeepSpeed does is the outcome:
loaded and equal, loaded and different, or refused (its exception, first line); the universal route unsupported
where this DeepSpeed keeps its flag elsewhere (``harness.adapters.deepspeed.universal``)."""

from __future__ import annotations

import copy

import torch.distributed as dist
import torch.nn.functional as F

from harness.zero.case import bound, build_model, global_batch, spec_for

BATCH, SEED = 8, 0


def _build(stage: int, opt: str = "sgd"):
    from harness.adapters.deepspeed.zero import DeepSpeedZero

    model = build_model("mlp", SEED, "float32")
    return model, DeepSpeedZero().build(copy.deepcopy(model), spec_for(opt), stage)


def _mine(x, y):
    n, r = dist.get_world_size(), dist.get_rank()
    per = BATCH // n
    return x[r * per:(r + 1) * per], y[r * per:(r + 1) * per]


def save(path: str, stage: int, steps: int, opt: str = "sgd") -> None:
    _, trainer = _build(stage, opt)
    x, y = global_batch("mlp", BATCH, SEED, "float32")
    for _ in range(steps):
        trainer.step(*_mine(x, y))
    trainer.engine.save_checkpoint(path, tag=f"step-{steps}", client_state={"step": steps})


def resume_and_compare(path: str, stage: int, done: int, more: int, universal: bool = False,
                       opt: str = "sgd") -> dict:
    from harness.adapters.deepspeed.universal import ask_universal

    model, trainer = _build(stage, opt)
    try:
        if universal:
            ask_universal(trainer.engine)
    except NotImplementedError as exc:  # this DeepSpeed keeps the flag elsewhere: the route is not driven
        return {"outcome": "unsupported", "detail": str(exc)}
    try:
        loaded, client = trainer.engine.load_checkpoint(path, tag=f"step-{done}", load_optimizer_states=True)
    except Exception as exc:  # noqa: BLE001 - DeepSpeed's refusal is the outcome
        return {"outcome": "refused", "detail": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    if loaded is None:
        return {"outcome": "refused", "detail": "load_checkpoint returned None (nothing loaded)"}
    x, y = global_batch("mlp", BATCH, SEED, "float32")
    single = copy.deepcopy(model)
    spec = spec_for(opt)
    optimizer = spec.build(single.parameters())
    grads = []
    for step in range(done + more):
        optimizer.zero_grad()
        F.mse_loss(single(x), y).backward()
        grads.append(max(float(p.grad.abs().max()) for p in single.parameters()))
        optimizer.step()
        if step >= done:
            trainer.step(*_mine(x, y))
    limit = bound(done + more, BATCH, dist.get_world_size(), "float32", spec, max(grads))
    want = dict(single.named_parameters())
    worst = max(float((p - want[k].detach()).abs().max() / max(float(want[k].detach().abs().max()), 1e-30))
                for k, p in trainer.full_params().items())
    return {"outcome": "pass" if worst <= limit else "fail", "worst": worst, "bound": limit,
            "step": (client or {}).get("step"), "detail": f"off by {worst:.3g} of its magnitude (bound {limit:.3g})"}


def to_universal(path: str, step: int) -> str:
    """DeepSpeed's conversion (``ds_to_universal``) of ``path``'s step into a universal checkpoint beside it;
    returns the new folder. Runs in the driver (it spawns its own worker processes)."""
    import argparse
    import os

    from deepspeed.checkpoint.ds_to_universal import main

    out = f"{path}-universal"
    args = argparse.Namespace(input_folder=os.path.join(path, f"step-{step}"),
                              output_folder=os.path.join(out, f"step-{step}"), num_extract_workers=1,
                              num_merge_workers=1, keep_temp_folder=False, strict=True, inject_missing_state=True)
    main(args)
    with open(os.path.join(out, "latest_universal"), "w") as f:
        f.write(f"step-{step}")
    return out
