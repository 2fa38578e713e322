"""The 3D conformance case (inputs, oracle, check; rank side): a GPT trained over (dp, pp, tp) with a schedule,
ZeRO stage and checkpointing, against one device trained on the same global batch (computed on every rank)."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from harness.world import rank_device
from reference.compose import parallelize, shard_stages
from reference.models import GPT
from reference.topology import ParallelDims, build_groups
from reference.zero import OptimizerSpec

_GROUPS: dict[ParallelDims, dict] = {}  # process groups per layout, created once per rank process
SEQ, LR = 4, 0.05
U64 = 2.0**-53


def _groups(dims: ParallelDims) -> dict:
    if dims not in _GROUPS:
        _GROUPS[dims] = build_groups(dims, dist.get_rank())
    return _GROUPS[dims]


def bound(step: int, tokens: int, model: GPT, world: int) -> float:
    """Largest allowed difference from one device, relative to each tensor's largest magnitude. The
    parallel run regroups sums: over tokens (microbatches, replicas), over hidden / ffn / vocabulary
    (tensor-parallel partial products and the vocabulary-parallel softmax), across ranks: each within
    (tokens + hidden + ffn + vocab + world) u of the magnitudes summed; the backward chains ~16 ops per
    block x layers (x 8 covers it for 4 blocks); momentum sums past gradients (factor 1/(1 - 0.9) = 10,
    rounded to 16); each step adds its own difference: x step."""
    hidden, ffn = model.embed.embedding_dim, model.blocks[0].fc1.out_features
    return step * (tokens + hidden + ffn + model.vocab + world) * U64 * 8 * len(model.blocks) * 16


def train_3d(dp: int, pp: int, tp: int, schedule: str, zero: int, checkpointing: bool, steps: int = 3,
             seed: int = 0, dropout: float = 0.1) -> dict:
    """The reference 3D stack against one device, with keyed dropout on (``reference.dropout``: every layout
    draws one device's masks, recomputation included)."""
    dims = ParallelDims(dp, pp, tp)
    try:
        groups = _groups(dims)
        torch.manual_seed(seed)
        model = GPT(dropout=dropout).to(rank_device())
        spec = OptimizerSpec("sgd", LR)
        trainer = parallelize(copy.deepcopy(model), dims, schedule, zero, checkpointing, groups=groups,
                              optimizer=spec)
    except ValueError as exc:
        return {"refused": str(exc)}
    def compare(single):
        expected = shard_stages(single, dims, dist.get_rank(), groups["tp"], 2 if schedule == "interleaved" else 1)
        return [((f"stage {s} {name}", p), q) for s, stage in trainer.stages.items()
                for (name, p), q in zip(stage.named_parameters(), expected[s].parameters(), strict=True)]

    return against_one_device(model, trainer, dp * trainer.schedule.num_microbatches, dims.world_size, steps, seed,
                              compare)


def against_one_device(model: GPT, trainer, batch: int, world: int, steps: int, seed: int, pairs) -> dict:
    """Train ``trainer`` and one device (a copy of ``model``) ``steps`` SGD-with-momentum steps on the same
    global batch; ``pairs(single)`` lists ((label, parallel parameter), expected tensor) after training."""
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, model.vocab, (batch, SEQ), generator=gen).to(rank_device())
    targets = torch.randint(0, model.vocab, (batch, SEQ), generator=gen).to(rank_device())
    single = copy.deepcopy(model)
    opt = OptimizerSpec("sgd", LR).build(single.parameters())
    want, got = [], []
    for step in range(steps):
        single.dropout_key.step = step
        opt.zero_grad()
        loss = single.loss(tokens, targets)
        loss.backward()
        opt.step()
        want.append(float(loss))
        got.append(trainer.step(tokens, targets))
    limit = bound(steps, tokens.numel(), model, world)
    worst, problems = 0.0, []
    for (label, p), q in pairs(single):
        p, q = p.detach(), q.detach()
        rel = float((p - q).abs().max() / max(float(q.abs().max()), 1e-300))
        worst = max(worst, rel)
        if not rel <= limit:
            problems.append(f"{label}: off by {rel:.3g} of its magnitude > {limit:.3g}")
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        if not abs(a - b) <= bound(k + 1, tokens.numel(), model, world) * abs(b):
            problems.append(f"loss after step {k + 1}: {a!r} vs one device {b!r}")
    return {"refused": None, "worst": worst, "bound": limit, "problems": problems, "losses": got, "want": want}


def train_torch_3d(dp: int, pp: int, tp: int, schedule: str, steps: int = 3, seed: int = 0) -> dict:
    """The torchtitan-style torch stack (harness.adapters.torch_3d) against one device."""
    from harness.adapters.torch_3d import Torch3D

    torch.manual_seed(seed)
    model = GPT().to(rank_device())
    microbatches = 2 * pp
    try:
        trainer = Torch3D(copy.deepcopy(model), dp, pp, tp, schedule, microbatches, LR)
    except NotImplementedError as exc:
        return {"refused": str(exc)}
    def compare(single):
        dense = dict(single.named_parameters())
        return [((name, p), dense[name]) for name, p in trainer.full_params().items()]

    return against_one_device(model, trainer, dp * microbatches, dp * pp * tp, steps, seed, compare)
