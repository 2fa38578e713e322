"""The reference sharded Muon: each rank holds its part of every parameter (``LAYOUTS``), steps AdamW's parameters
elementwise on its part, and for each Muon matrix all-gathers the parts of its update (the momentum is elementwise:
each rank's part of it is the one device's), orthogonalises the whole matrix per logical part — every rank the same
arithmetic on the same matrix, so the same bits as one device — and applies its own part.

Layouts (every parameter, over the group's n ranks): ``replicated`` (data parallelism: all of it), ``rows`` (dim 0 in
blocks of ceil(rows / n), the last ones short or empty — DTensor's ``Shard(0)``, FSDP2's and a column-parallel
layer's), ``cols`` (dim 1 the same way — a row-parallel layer's; a vector's dim 0), ``flat`` (every parameter
flattened and concatenated in order, the whole cut into n ranges of ceil(total / n) — ZeRO-1/2's flat shard,
parameters straddling ranks)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..zero.flat import _all_gather
from .spec import MuonSpec, muon_update, orthogonalised

LAYOUTS = ("replicated", "rows", "cols", "flat")


def owned(shapes: dict, layout: str, n: int) -> dict:
    """name -> [(flat indices of the elements rank r holds, the shape it holds them in) for r in range(n)]."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}.")
    out, offset = {}, 0
    total = sum(math.prod(s) for s in shapes.values())
    chunk = math.ceil(total / n)
    for name, shape in shapes.items():
        numel, per = math.prod(shape), []
        whole = torch.arange(numel).reshape(shape)
        for r in range(n):
            if layout == "replicated":
                per.append((whole.flatten(), tuple(shape)))
            elif layout == "flat":
                lo, hi = max(r * chunk - offset, 0), min((r + 1) * chunk - offset, numel)
                idx = torch.arange(lo, max(hi, lo))
                per.append((idx, (len(idx),)))
            else:
                dim = 1 if layout == "cols" and len(shape) == 2 else 0
                block = math.ceil(shape[dim] / n)
                lo, hi = min(r * block, shape[dim]), min((r + 1) * block, shape[dim])
                part = whole.narrow(dim, lo, hi - lo)
                per.append((part.flatten(), tuple(part.shape)))
        out[name], offset = per, offset + numel
    return out


def local_part(full: dict, layout: str, rank: int, n: int) -> dict:
    """Each tensor of ``full`` (name -> whole tensor) as rank ``rank`` of ``n`` holds it under ``layout``."""
    parts = owned({k: tuple(v.shape) for k, v in full.items()}, layout, n)
    return {k: v.flatten()[parts[k][rank][0]].reshape(parts[k][rank][1]) for k, v in full.items()}


class ShardedMuon:
    """Muon + AdamW over ``group`` under ``layout``, from the whole ``params`` (name -> tensor, the same on every
    rank): ``step(local_grads)`` (each name -> this rank's part), ``full()`` (name -> whole tensor, collective)."""

    def __init__(self, params: dict, spec: MuonSpec, layout: str, group=None):
        self.spec, self.layout, self.group = spec, layout, group
        self.n, self.r = dist.get_world_size(group), dist.get_rank(group)
        self.shapes = {k: tuple(v.shape) for k, v in params.items()}
        self.owned = owned(self.shapes, layout, self.n)
        self.local = {k: v.detach().clone() for k, v in local_part(params, layout, self.r, self.n).items()}
        self.muon = [k for k, s in self.shapes.items() if spec.takes(k, s)]
        self.selections = {k: self._selections(k) for k in self.muon}
        self.bufs = {k: torch.zeros_like(self.local[k]) for k in self.muon}
        rest = [self.local[k] for k in self.shapes if k not in self.muon]
        self.adamw = spec.adamw(rest) if rest else None

    def gather(self, name: str, piece: torch.Tensor) -> torch.Tensor:
        """The whole tensor ``name`` from every rank's ``piece`` of it (an all-gather of the padded parts)."""
        if self.layout == "replicated":
            return piece
        per = self.owned[name]
        longest = max(len(idx) for idx, _ in per)
        flat = torch.zeros(longest, dtype=piece.dtype, device=piece.device)
        flat[:piece.numel()] = piece.reshape(-1)
        pieces = torch.empty(self.n * longest, dtype=piece.dtype, device=piece.device)
        _all_gather(pieces, flat, self.group)
        whole = torch.empty(math.prod(self.shapes[name]), dtype=piece.dtype, device=piece.device)
        for r, (idx, _) in enumerate(per):
            whole[idx.to(piece.device)] = pieces[r * longest:r * longest + len(idx)]
        return whole.reshape(self.shapes[name])

    def _selections(self, name: str) -> list:
        """Per logical part of matrix ``name``: (the mask of this rank's local elements in that part, their flat
        indices into the part) — fixed by the shapes and the layout, computed once."""
        idx = self.owned[name][self.r][0].to(self.local[name].device)
        cols, out, start = self.shapes[name][1], [], 0
        row_of = idx // cols
        for rows in self.spec.part_rows(name, self.shapes[name][0]):
            mine = (row_of >= start) & (row_of < start + rows)
            out.append((mine, idx[mine] - start * cols))
            start += rows
        return out

    def orthogonal(self, name: str, update: torch.Tensor) -> list:
        """[(the mask of this rank's local elements in a logical part, their orthogonalised values, the part's lr)]
        of the whole matrix's update, gathered from every rank's part."""
        parts = orthogonalised(self.spec, name, self.gather(name, update))
        return [(mine, ortho.flatten()[at], lr)
                for (mine, at), (_, ortho, lr) in zip(self.selections[name], parts, strict=True)]

    def step(self, grads: dict) -> None:
        spec = self.spec
        for k in self.muon:  # the same order on every rank: the gathers pair up
            p = self.local[k]
            update = muon_update(spec, grads[k].to(p.dtype).reshape(p.shape), self.bufs[k])
            p.mul_(1 - spec.lr * spec.weight_decay)
            flat = p.view(-1)
            for mine, ortho, lr in self.orthogonal(k, update):
                flat[mine] = flat[mine].add(ortho, alpha=-lr)
        if self.adamw:
            for k, p in self.local.items():
                if k not in self.muon:
                    p.grad = grads[k].to(p.dtype).reshape(p.shape)
            self.adamw.step()

    def full(self) -> dict:
        return {k: self.gather(k, v) for k, v in self.local.items()}


class ReferenceMuon:
    """The reference through the Muon contract (``harness.contracts.muon``)."""

    description = "ours: Muon + AdamW, each matrix gathered and orthogonalised whole per logical part"
    optimizer = ShardedMuon

    def shard(self, params: dict, spec: MuonSpec, layout: str, group):
        return self.optimizer(params, spec, layout, group)

    def step(self, state: ShardedMuon, grads: dict) -> None:
        state.step(grads)

    def full(self, state: ShardedMuon) -> dict:
        return state.full()
