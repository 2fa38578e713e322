"""Every traced tensor of every rank mapped onto the one-device tensor it is part of, and compared with it.

A module's output (or the gradient at it) on a rank is the one-device tensor's
- rows: the rank's replica's block of the global batch (dp coordinate), then its calls' rows in call order (the
  accumulation passes' and micro-batches' blocks, each call as many rows as it had), along the module's batch
  dimension (``oracle._batch_dims``);
- positions: under cp, the rank's zigzag shard (chunks c and 2 cp - 1 - c), along the other leading dimension;
- features (last dimension): all of them, or the rank's TP chunk where it holds 1 / tp of them (a DTensor output:
  the chunk its placement names).
A tensor that maps onto no slice of the one-device tensor (another shape; a partial sum) is not compared: listed
as such, never blamed. A parameter's local gradient is its box of the replica's one-device gradient; the dense
state after each step gives the gradient the optimizer was given (``oracle.gradient_from_state``), the norm and
the update.

Each item's bound is the case's (``harness.stack.case.bound``: the structure's rounding over the whole chain —
an intermediate tensor has fewer operations behind it, so the bound never blames rounding) relative to the whole
one-device tensor's largest magnitude (a micro-batch's slice may be all zeros by structure: padding)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from reference.context_parallel.layout import positions as zigzag
from reference.stack.topology import ParallelDims, coordinates

from ..stack.case import bound
from .oracle import clip_coefficient, gradient_from_state


def coords_of(layout, rank: int):
    """The rank's coordinates in the contract's order (dp x pp x cp x tp, TP innermost)."""
    return coordinates(ParallelDims(layout.dp, layout.pp, layout.tp, cp=layout.cp, ep=layout.ep), rank)


def conventions(layout) -> tuple[int, ...]:
    """The factors a replica's activation and parameter gradients may carry before the reduction: 1 (its share of
    the global batch's mean loss: the reduction sums) or dp x cp (each replica's loss divided by its share of the
    counted targets: the reduction averages — DDP's, FSDP's, Megatron's convention). Either is the contract's; a
    factor of dp x cp on a stack whose reduction sums shows at the reduced gradient instead."""
    return tuple(sorted({1, layout.dp * layout.cp}))


PHASES = ("forward", "backward", "local gradient", "reduced gradient", "gradient norm", "clipped gradient", "update",
          "loss")
"""Execution order within a step: each phase's tensors in the one-device model's order (forward: the modules as
they run; backward: as the gradient reaches them; parameters: as their gradients are accumulated); the loss the
step returned last."""


@dataclass
class Item:
    step: int
    phase: str
    name: str
    rank: int
    call: int
    got: torch.Tensor
    want: torch.Tensor
    limit: float
    """Absolute: the bound x the one-device tensor's magnitude."""
    rel: float
    bound: float
    order: int
    meta: dict = field(default_factory=dict)

    @property
    def off(self) -> bool:
        return not self.rel <= self.bound

    @property
    def key(self) -> tuple:
        return self.step, PHASES.index(self.phase), self.order, self.call, self.rank


def _item(step, phase, name, rank, call, got, want, mag, limit, order, scales=(1,), **meta) -> Item:
    """``scales``: the factors a gradient on a replica may legitimately carry (``CONVENTIONS``): the one nearest
    the stack's is taken (the item's ``want`` scaled by it; ``meta["scale"]``)."""
    mag = max(mag, 1e-300)
    if len(scales) > 1:
        scale = min(scales, key=lambda k: float((got - k * want).abs().max()) if got.numel() else 0.0)
        want, mag, meta = want * scale, mag * scale, {**meta, "scale": scale}
    diff = (got - want).abs().max() if got.numel() else torch.tensor(0.0)
    rel = float(diff) / mag if bool(torch.isfinite(got).all()) else math.inf
    return Item(step, phase, name, rank, call, got, want, limit * mag, rel, limit, order, meta)


def _features(record, local, dense, tp, t):
    """(start, length) of the last dimension this rank holds, or None."""
    shard = record.get("shard")
    if shard == "partial":
        return None
    if shard is not None and shard[0] == local.dim() - 1:
        return shard[1], shard[2]
    if local.shape[-1] == dense.shape[-1]:
        return 0, dense.shape[-1]
    if local.shape[-1] * tp == dense.shape[-1]:
        return t * local.shape[-1], local.shape[-1]
    return None


def _positions(record, local, dense, sdim, layout, coords, seq):
    """The global positions this rank holds along the sequence dimension (None: all of them, in order), or False:
    a DTensor's chunk (sequence parallelism), the rank's zigzag shard under cp, else unmapped."""
    shard = record.get("shard")
    if shard not in (None, "partial") and shard[0] == sdim:
        return torch.arange(shard[1], shard[1] + shard[2])
    if local.shape[sdim] == dense.shape[sdim]:
        return None
    if layout.cp > 1 and local.shape[sdim] * layout.cp == dense.shape[sdim]:
        return zigzag(seq, layout.cp, coords.cp, "zigzag")
    return False


def _slice(dense, rows, pos, feats, bdim, sdim):
    index = [slice(None)] * dense.dim()
    index[bdim] = rows
    want = dense[tuple(index)]
    want = want.index_select(sdim, pos) if pos is not None else want
    return want.narrow(-1, *feats)


def _index(record, row0, coords, layout, dense, bdim, seq):
    """(the one-device slice, rows, positions or None, sequence dimension), or None where the record maps onto
    nothing."""
    local = record["tensor"]
    if local.dim() != dense.dim() or local.dim() < 3 or bdim not in (0, 1) or \
            row0 + local.shape[bdim] > dense.shape[bdim]:  # (batch, sequence, features) only; rows it has
        return None
    sdim = 1 - bdim
    rows = torch.arange(row0, row0 + local.shape[bdim])
    pos = _positions(record, local, dense, sdim, layout, coords, seq)
    feats = _features(record, local, dense, layout.tp, coords.tp)
    if pos is False or feats is None:
        return None
    want = _slice(dense, rows, pos, feats, bdim, sdim)
    return (want, rows, pos, sdim) if tuple(want.shape) == tuple(local.shape) else None


def activations(result, oracle, layout, spec, tokens, n) -> tuple[list[Item], list[str]]:
    """The items of a rank's module records, and the (phase, name) of those that map onto nothing."""
    coords = coords_of(layout, result["rank"])
    per = len(tokens) // layout.dp
    items, unmapped, maps = [], set(), {}
    offsets: dict = {}
    for rec in sorted((r for r in result["records"] if r["phase"] == "forward"), key=lambda r: (r["step"], r["call"])):
        step, name = rec["step"], rec["name"]
        dense = oracle["steps"][step - 1]["forward"].get(name)
        bdim = oracle["batch_dim"].get(name)
        row0 = coords.dp * per + offsets.get((step, name), 0)
        mapped = _index(rec, row0, coords, layout, dense, bdim, tokens.shape[1]) if dense is not None else None
        if mapped is None:
            unmapped.add(("forward", name))
            continue
        offsets[(step, name)] = offsets.get((step, name), 0) + rec["tensor"].shape[bdim]
        maps[(step, name, rec["call"])] = (mapped, bdim)
    for rec in result["records"]:
        key = (rec["step"], rec["name"], rec["call"])
        if rec["phase"] not in ("forward", "backward") or key not in maps:
            continue
        (want, rows, pos, sdim), bdim = maps[key]
        table = oracle["steps"][rec["step"] - 1][rec["phase"]]
        dense = table.get(rec["name"])
        if dense is None:
            continue
        if rec["phase"] == "backward":  # the same slice of the gradient
            feats = _features(rec, rec["tensor"], dense, layout.tp, coords.tp)
            want = _slice(dense, rows, pos, feats, bdim, sdim) if feats is not None else None
            if want is None or tuple(want.shape) != tuple(rec["tensor"].shape):  # a partial gradient: not mapped
                unmapped.add(("backward", rec["name"]))
                continue
        order = (oracle["order"] if rec["phase"] == "forward" else oracle["back_order"]).index(rec["name"])
        tok = tokens[rows].index_select(1, pos) if pos is not None else tokens[rows]
        items.append(_item(rec["step"], rec["phase"], rec["name"], result["rank"], rec["call"], rec["tensor"], want,
                           float(dense.abs().max()), bound(rec["step"], tokens.numel(), spec, n), order,
                           scales=conventions(layout) if rec["phase"] == "backward" else (1,),
                           positions=pos, seq_dim=sdim, batch_dim=bdim, tokens=tok))
    return items, sorted(unmapped)


def local_gradients(result, oracle, layout, spec, tokens, n) -> list[Item]:
    """A rank's parameters' gradients before any reduction, against its replica's share (data parallelism only:
    under cp a rank's share is not a loss over its tokens; a tied copy holds one path's part by design)."""
    coords = coords_of(layout, result["rank"])
    items = []
    for rec in result["records"]:
        if rec["phase"] != "local gradient" or layout.cp > 1 or layout.ep > 1:
            continue
        replicas = oracle["steps"][rec["step"] - 1]["replicas"]
        if replicas is None or rec["name"] in ("embed.weight", "head.weight") and spec.tie_embeddings:
            continue
        offsets, lengths, shape = rec["box"]
        dense = replicas[coords.dp].get(rec["name"])
        if dense is None or tuple(dense.shape) != tuple(shape):
            continue
        got = rec["tensor"][tuple(slice(0, length) for length in lengths)]
        want = dense[tuple(slice(o, o + length) for o, length in zip(offsets, lengths, strict=True))]
        order = oracle["param_order"].index(rec["name"]) if rec["name"] in oracle["param_order"] else 0
        # relative to the step's largest gradient (case.held's floor for the optimizer state): a gradient zero by
        # structure (an attention key's bias: softmax is shift-invariant) is rounding noise at the scale of the
        # terms it sums, not at its own
        whole = max(float(g.abs().max()) for g in oracle["steps"][rec["step"] - 1]["grads"].values())
        items.append(_item(rec["step"], "local gradient", rec["name"], result["rank"], 0, got, want, whole,
                           bound(rec["step"], tokens.numel(), spec, n), order, scales=conventions(layout)))
    return items


def losses(result, oracle, spec, tokens, n) -> list[Item]:
    """The loss each step returned against one device's: the step's value, last in its order (a tensor off before it
    says more than the sum it feeds)."""
    items = []
    for k, got in enumerate(result.get("losses", [])):
        want = oracle["steps"][k]["loss"]
        items.append(_item(k + 1, "loss", "the loss", result["rank"], 0, torch.tensor([got], dtype=torch.float64),
                           torch.tensor([want], dtype=torch.float64), abs(want), bound(k + 1, tokens.numel(), spec, n),
                           0))
    return items


def from_state(result, oracle, spec, recipe, tokens, n) -> list[Item]:
    """The dense state's stages: the reduced gradient (with clipping: the clipped one / the stack's own
    coefficient), the gradient norm, the clipped gradient, the update — per step, every parameter."""
    items, before, params = [], None, oracle["initial"]
    order = {name: i for i, name in enumerate(oracle["param_order"])}
    for k, state in enumerate(result["states"]):
        step, want = k + 1, oracle["steps"][k]
        limit = bound(step, tokens.numel(), spec, n)
        scale = max(float(g.abs().max()) for g in want["grads"].values())  # the state's scale (case.held's floor)
        grads = gradient_from_state(recipe.optimizer, state["optimizer"], before) or {}
        coef = clip_coefficient(recipe.max_grad_norm, state.get("grad_norm")) if recipe.max_grad_norm else 1.0
        for name, g in grads.items():
            if name not in want["grads"]:
                continue
            if recipe.max_grad_norm is not None:
                items.append(_item(step, "reduced gradient", name, result["rank"], 0, g / coef, want["grads"][name],
                                   scale, limit, order.get(name, 0)))
            items.append(_item(step, "clipped gradient" if recipe.max_grad_norm else "reduced gradient", name,
                               result["rank"], 0, g, want["clipped"][name], scale, limit, order.get(name, 0)))
        if recipe.max_grad_norm is not None and want["norm"] is not None:
            got = torch.tensor([float(state.get("grad_norm") or math.nan)], dtype=torch.float64)
            items.append(_item(step, "gradient norm", "the global gradient norm", result["rank"], 0, got,
                               torch.tensor([want["norm"]], dtype=torch.float64), abs(want["norm"]), limit, 0))
        for name, p in state["params"].items():
            if name in want["update"] and name in params and tuple(p.shape) == tuple(params[name].shape):
                upd = want["update"][name]
                items.append(_item(step, "update", name, result["rank"], 0, p - params[name], upd,
                                   max(float(upd.abs().max()), float(params[name].abs().max())), limit,
                                   order.get(name, 0), before=params[name]))
        before, params = state["optimizer"], {**params, **state["params"]}
    return items
