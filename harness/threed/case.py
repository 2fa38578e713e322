"""The 3D conformance case (inputs, oracle, check; rank side): a GPT trained over (dp, pp, tp) with a schedule,
ZeRO stage and checkpointing, against one device trained on the same global batch (computed on every rank)."""

from __future__ import annotations

import copy
import math

import torch
import torch.distributed as dist

from harness.errors import describe
from harness.runtime.rank import computed_once, failed_in_implementation, rank_device
from reference.models import GPT
from reference.stack.compose import parallelize, shard_stages
from reference.stack.topology import ParallelDims, build_groups
from reference.zero import OptimizerSpec

_GROUPS: dict[ParallelDims, dict] = {}  # process groups per layout, created once per rank process
SEQ, LR = 4, 0.05
U64 = 2.0**-53
CLIP = [(0.5, 2.0), (1e6, math.inf), (0.1, math.inf)]
"""Clipping per step: the 2-norm (8.6-14.5 at step 1, by layout: the batch grows with dp x microbatches)
clipped to 0.5; the inf norm (1.8-2.8) not clipped; then (1.2-1.3) clipped to 0.1 — every layout clips
and does not, under both norms."""


def layouts(n: int, model: GPT) -> list[tuple[int, int, int]]:
    """Every (dp, pp, tp) of world size ``n`` that ``model`` admits: tp divides the heads, pp <= layers."""
    return [(dp, pp, n // (dp * pp)) for dp in range(1, n + 1) for pp in range(1, n + 1)
            if n % (dp * pp) == 0 and model.heads % (n // (dp * pp)) == 0 and pp <= len(model.blocks)]


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
             seed: int = 0, dropout: float = 0.1, clip: list[tuple[float, float]] | None = CLIP,
             tie: bool = True, accumulation: int = 1) -> dict:
    """The reference 3D stack against one device, with keyed dropout on (``reference.dropout``: every layout
    draws one device's masks, recomputation included) and global gradient-norm clipping
    (``reference.clipping``) with ``clip``'s (max_norm, norm_type) at step 1, 2, ... (each step's norm
    compared too; None: no clipping), the embedding tied to the LM head (``tie``: on the first and the
    last pipeline stage, summed over the embedding group), ``accumulation`` pipeline passes per optimizer
    step (one device: one step on the k-times batch)."""
    dims = ParallelDims(dp, pp, tp)
    try:
        groups = _groups(dims)
        torch.manual_seed(seed)
        model = GPT(dropout=dropout, tie_embeddings=tie).to(rank_device())
        spec = OptimizerSpec("sgd", LR)
        trainer = parallelize(copy.deepcopy(model), dims, schedule, zero, checkpointing, groups=groups,
                              optimizer=spec, max_grad_norm=clip[0][0] if clip else None,
                              accumulation=accumulation)
    except ValueError as exc:
        return {"refused": str(exc)}
    def compare(single):
        expected = shard_stages(single, dims, dist.get_rank(), groups["tp"], 2 if schedule == "interleaved" else 1)
        return [((f"stage {s} {name}", p), q) for s, stage in trainer.stages.items()
                for (name, p), q in zip(stage.named_parameters(), expected[s].parameters(), strict=True)]

    return against_one_device(model, trainer, dp * trainer.schedule.num_microbatches * accumulation, dims.world_size,
                              steps, seed, compare, clip)


def norm_bound(step: int, grads: list[torch.Tensor], model: GPT, world: int, tokens: int) -> float:
    """Allowed relative difference of the global gradient norm from one device's at ``step``: each gradient
    element may differ by ``bound`` x its tensor's largest magnitude m_t (the parameters' derivation, for
    the gradients they are computed from), so | |g'| - |g| | <= |g' - g| <= bound sqrt(sum_t n_t m_t^2);
    plus the norm's own sum of N squares in another order, N u. Relative to one device's norm |g|."""
    return _norm_limit(step, _norm_parts(grads), model, world, tokens)


def _norm_parts(grads: list[torch.Tensor]) -> tuple[float, int]:
    """(sqrt(sum_t n_t m_t^2) / |g|, N): what ``norm_bound`` needs of one device's gradients."""
    spread = math.sqrt(sum(g.numel() * float(g.abs().max()) ** 2 for g in grads))
    norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
    return spread / max(norm, 1e-300), sum(g.numel() for g in grads)


def _norm_limit(step: int, parts: tuple[float, int], model: GPT, world: int, tokens: int) -> float:
    return bound(step, tokens, model, world) * parts[0] + parts[1] * U64


def differences(pairs, limit: float, absolute: float = 0.0) -> tuple[float, list[str]]:
    """(largest difference relative to the expected tensor's magnitude, one line per tensor off by more
    than ``limit`` x its magnitude + ``absolute``) over (label, got, expected) triples."""
    worst, problems = 0.0, []
    for label, p, q in pairs:
        p, q = p.detach(), q.detach()
        mag = max(float(q.abs().max()), 1e-300)
        diff = float((p - q).abs().max())
        worst = max(worst, diff / mag)
        if not diff <= limit * mag + absolute:
            problems.append(f"rank {dist.get_rank()} {label}: off by {diff / mag:.3g} > {limit + absolute / mag:.3g}")
    return worst, problems


_ONE_DEVICE: dict = {}
"""One device's runs by what determines them, computed once per World by rank 0 and broadcast (8 ranks on
2 cores would otherwise each train the same model every case)."""


def global_batch(vocab: int, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (tokens, targets) every rank passes to a 3D step: ``rows`` x SEQ, drawn from ``seed`` + 1."""
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, vocab, (rows, SEQ), generator=gen).to(rank_device())
    return tokens, torch.randint(0, vocab, (rows, SEQ), generator=gen).to(rank_device())


def one_device(model: GPT, tokens, targets, steps: int, clip) -> dict:
    """``model`` trained ``steps`` SGD-with-momentum steps on one device (keyed dropout, clipping per ``clip``):
    its losses, per step (norm before clipping, ``_norm_parts`` of its gradients), the trained model (CPU).
    Collective over the default group: every rank of the World calls it with the same arguments."""
    key = (tuple(float(p.double().sum()) for p in model.parameters()), tuple(model.state_dict()),
           model.dropout_key.seed, getattr(model.drop_embed, "p", 0.0), model.tie_embeddings, tuple(tokens.shape),
           tuple(tokens.flatten().tolist()),
           tuple(targets.flatten().tolist()), steps, tuple(clip or ()))
    return computed_once(_ONE_DEVICE, key, lambda: _train_one_device(model, tokens, targets, steps, clip))


def _train_one_device(model: GPT, tokens, targets, steps: int, clip) -> dict:
    single = copy.deepcopy(model)
    opt = OptimizerSpec("sgd", LR).build(single.parameters())
    losses, norms = [], []
    for step in range(steps):
        single.dropout_key.step = step
        opt.zero_grad()
        loss = single.loss(tokens, targets)
        loss.backward()
        if clip:
            parts = _norm_parts([p.grad for p in single.parameters()])
            norms.append((float(torch.nn.utils.clip_grad_norm_(single.parameters(), *clip[step % len(clip)])), parts))
        opt.step()
        losses.append(float(loss.detach()))
    return {"losses": losses, "norms": norms, "model": single.cpu()}


def failed(detail: str) -> dict:
    """A rank's result where the trainer failed (its own exception, or the World's verdict of a call that
    failed: ``harness.runtime.world.run_or_fail``)."""
    return {"refused": None, "error": detail, "worst": math.inf, "bound": math.nan, "problems": [detail], "losses": [],
            "want": [], "norms": []}


def against_one_device(model: GPT, trainer, batch: int, world: int, steps: int, seed: int, pairs,
                       clip: list[tuple[float, float]] | None = None) -> dict:
    """Train ``trainer`` and one device (a copy of ``model``) ``steps`` SGD-with-momentum steps on the same
    global batch; ``pairs(single)`` lists ((label, parallel parameter), expected tensor) after training.
    ``clip``: (max_norm, norm_type) per step (cycled): both clip their gradients' global norm (one device:
    ``torch.nn.utils.clip_grad_norm_``; the trainer: its ``max_grad_norm`` and ``norm_type`` set before
    the step) and the trainer's ``last_grad_norm`` is held to one device's."""
    tokens, targets = global_batch(model.vocab, batch, seed)
    oracle = one_device(model, tokens, targets, steps, clip)
    single = oracle["model"].to(rank_device())
    want, got, problems, norms = oracle["losses"], [], [], []
    for step in range(steps):
        if clip:
            trainer.max_grad_norm, trainer.norm_type = clip[step % len(clip)]
        try:
            got.append(trainer.step(tokens, targets))
        except Exception as exc:  # noqa: BLE001 - the trainer's failure is a verdict; peers inside it are ended
            return failed(failed_in_implementation(f"rank {dist.get_rank()}: step {step + 1} raised {describe(exc)}"))
        if clip:
            expected, parts = oracle["norms"][step]
            norm, limit = trainer.last_grad_norm, _norm_limit(step + 1, parts, model, world, tokens.numel())
            rel = abs(norm - expected) / expected if norm is not None else math.inf
            norms.append((norm, expected, rel, limit))
            if not rel <= limit:
                problems.append(f"gradient norm at step {step + 1}: {norm!r} vs one device {expected!r} "
                                f"(off by {rel:.3g} > {limit:.3g})")
    limit = bound(steps, tokens.numel(), model, world)
    worst, off = differences([(label, p, q) for (label, p), q in pairs(single)], limit)
    problems += off
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        if not abs(a - b) <= bound(k + 1, tokens.numel(), model, world) * abs(b):
            problems.append(f"loss after step {k + 1}: {a!r} vs one device {b!r}")
    return {"refused": None, "worst": worst, "bound": limit, "problems": problems, "losses": got, "want": want,
            "norms": norms}


def train_torch_3d(dp: int, pp: int, tp: int, schedule: str, steps: int = 3, seed: int = 0,
                   clip: list[tuple[float, float]] | None = None, clip_recipe: str = "per-mesh",
                   tie: bool = False, split_tied: bool = False) -> dict:
    """The torchtitan-style torch stack (harness.adapters.torch.stack_trainer) against one device; ``clip`` as in
    ``train_3d`` (an exception from the stack's clipping is this rank's ``error``). ``tie``: the tied GPT
    (the stack refuses it over pp > 1); ``split_tied``: split it anyway, as a user would, to measure what that does."""
    from harness.adapters.torch.stack_trainer import Torch3D

    torch.manual_seed(seed)
    model = GPT(tie_embeddings=tie).to(rank_device())
    microbatches = 2 * pp
    try:
        cls = type("SplitTied", (Torch3D,), {"split_tied": True}) if split_tied else Torch3D
        trainer = cls(copy.deepcopy(model), dp, pp, tp, schedule, microbatches, LR)
    except NotImplementedError as exc:
        return {"refused": str(exc)}
    trainer.clip_recipe = clip_recipe
    def compare(single):
        dense = dict(single.named_parameters(remove_duplicate=False))
        return [((name, p), dense[name]) for name, p in trainer.full_params().items()]

    try:
        return against_one_device(model, trainer, dp * microbatches, dp * pp * tp, steps, seed, compare, clip)
    except Exception as exc:  # the stack's own failure is a verdict, not a harness crash
        return {"refused": None, "error": f"{type(exc).__name__}: {exc}", "problems": [f"raised {exc!r}"[:300]],
                "worst": math.inf}
