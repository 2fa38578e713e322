"""Whether a checkpointed stack recomputed what its policy says (``Layout.checkpoint_policy``): the ops its first step
ran (``harness.checkpoint.recompute.counter``: each op by name, forward and backward) against the same stack's step
without checkpointing — everything else about the two steps is the same, so the difference is the recompute.

"full": the blocks' forwards run again, their matrix multiplications among them — more matmuls (mm, addmm, bmm) and
more other ops. "selective": the matmuls' outputs saved — the same matmuls, more other ops (the nonlinearities, the
norms). A policy not applied (no more ops) or one that saves nothing (more matmuls) computes the same gradients and
fails here alone. A compiled stack runs inductor's kernels, which no dispatch mode counts: its count is the ops of
the backward graphs torch.compile's partitioner makes (``harness.stack.compiled_ops``), the same comparison — a
compiled step without checkpointing also recomputes some cheap ops (the min-cut partitioner's own choice), so
"selective" must recompute more than that and no matmul."""

from __future__ import annotations

import contextlib
from dataclasses import replace

MATMULS = ("aten.mm", "aten.addmm", "aten.bmm")


def step_ops(impl_spec: str, spec, layout, recipe, seed: int = 0) -> dict:
    """Rank side: {"ops": {op: count} of one step of ``impl_spec``'s stack on ``layout``}, or {"unsupported": why}
    where this torch's dispatch mode cannot count or the stack does not provide the case (its sentence)."""
    import torch.distributed as dist

    from harness.checkpoint.recompute import counter
    from harness.contracts import Unsupported
    from harness.records import registry
    from harness.runtime.rank import rank_device

    from .compiled_ops import recording
    from .inputs import global_batch, rows_for, seq_for

    tokens, targets = global_batch(spec.vocab, rows_for(layout, recipe), seed, seq_for(layout))
    with contextlib.ExitStack() as stack:
        if layout.compile:  # inductor's kernels reach no dispatch mode: the compiled backward graphs' ops
            ops = stack.enter_context(recording())
            if ops is None:
                return {"unsupported": "this torch's AOT API (functorch.compile) does not record a compiled backward "
                                       "(probed)."}
        else:
            ops = counter()
            if ops is None:
                return {"unsupported": "this torch's dispatch mode does not count a backward's ops (probed)."}
        try:
            trainer = registry.load(impl_spec, "stack").build(spec, layout, recipe)
        except (Unsupported, ValueError, NotImplementedError) as exc:
            return {"unsupported": str(exc)}
        trainer.load_dense(spec.build(seed).state_dict())
        with contextlib.nullcontext() if layout.compile else ops:
            trainer.step(tokens.to(rank_device()), targets.to(rank_device()))
    dist.barrier()
    return {"ops": dict(ops.ops)}


def _split(ops: dict) -> tuple[int, int]:
    matmuls = sum(n for op, n in ops.items() if op in MATMULS)
    return matmuls, sum(ops.values()) - matmuls


def problems(policy: str, checkpointed: dict, plain: dict, rank: int) -> list[str]:
    """What ``checkpointed``'s op counts say against ``plain``'s under ``policy`` — one line per way it is off."""
    (mm, other), (mm0, other0) = _split(checkpointed), _split(plain)
    out = []
    if other <= other0:
        out.append(f"rank {rank}: {policy} checkpointing recomputed nothing: {other} non-matmul ops in the step, "
                   f"{other0} without checkpointing")
    if policy == "selective" and mm != mm0:
        out.append(f"rank {rank}: selective checkpointing ran {mm} matmuls, {mm0} without checkpointing: the "
                   "matmuls' outputs were not all saved")
    if policy == "full" and mm <= mm0:
        out.append(f"rank {rank}: full checkpointing ran {mm} matmuls, {mm0} without checkpointing: the blocks' "
                   "forwards were not recomputed")
    return out


def check(world, impl: str, spec, layout, recipe) -> list[str] | str:
    """The problems of ``impl``'s checkpointed step on ``layout`` (every rank), or the sentence why it cannot be
    counted (a string)."""
    from harness.runtime.world import run_or_fail

    from . import case as ranks

    runs = [run_or_fail(world, step_ops, impl, spec, lay, recipe, timeout=300, failed=ranks.failed)
            for lay in (layout, replace(layout, checkpointing=False, checkpoint_policy="full"))]
    for per_rank in runs:
        for r in per_rank:
            if "ops" not in r:
                return r.get("unsupported") or "; ".join(r.get("problems", [])) or "the step could not be counted"
    return [p for rank, (a, b) in enumerate(zip(*runs, strict=True))
            for p in problems(layout.checkpoint_policy, a["ops"], b["ops"], rank)]
