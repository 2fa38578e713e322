"""Muon and its AdamW as one optimizer (``step``, ``zero_grad``, ``state``, ``param_groups``), built by
``OptimizerSpec("muon", ...).build_named``: what the stacks' one-device oracle trains, and the reference stack's
optimizer.

Muon's matrices go to torch's ``torch.optim.Muon`` (Newton-Schulz in bfloat16) when every one is whole on this rank
and the iteration is torch's; otherwise to ``ReferenceMatrices``: the reference iteration (``reference.muon.spec``,
bit for bit torch's in bfloat16) in ``ns_dtype`` — float64 is exact arithmetic's stand-in — each matrix split over a
group (``shards``: {id(param): (dim, group, replicas)}, a column-parallel weight's rows, a row-parallel one's
columns: ``reference.models.sharding.tp_split_matrices``) all-gathered, orthogonalised whole and its own
block kept. The rest (embedding, head, vectors) to torch's AdamW."""

from __future__ import annotations

from collections.abc import MutableMapping

import torch
import torch.distributed as dist

from .spec import MuonSpec, at_lr, muon_update, orthogonalised, torch_adjusts


def gathered(block: torch.Tensor, shard) -> torch.Tensor:
    """The whole matrix from every rank's ``block`` of it; ``shard``: (dim, group, replicas) of a split matrix
    (``tp_split_matrices``), None for a whole one (returned as it is)."""
    if shard is None:
        return block
    dim, group, replicas = shard
    parts = [torch.empty_like(block) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, block.contiguous(), group=group)
    return torch.cat(parts[::replicas], dim)  # each block once: the first of its replicas


def block_of(full: torch.Tensor, shape, shard) -> torch.Tensor:
    """This rank's block (of ``shape``) of the whole matrix ``full`` split as ``shard`` says (None: all of it)."""
    if shard is None:
        return full
    dim, group, replicas = shard
    return full.narrow(dim, dist.get_rank(group) // replicas * shape[dim], shape[dim])


def block_steps(spec: MuonSpec, name: str, full: torch.Tensor, shape, shard, dtype: torch.dtype):
    """(this rank's block of ``shape`` of one logical part's orthogonalised update — zeros outside the part —, that
    part's adjusted lr) per logical part of the whole matrix's update ``full`` (the step: block -= lr x it)."""
    for rows, ortho, lr in orthogonalised(spec, name, full, dtype):
        part = torch.zeros_like(full)
        part[rows] = ortho.to(full.dtype)
        yield block_of(part, shape, shard), lr


class ReferenceMatrices(torch.optim.Optimizer):
    """Muon over ``named`` matrices (the reference iteration in ``dtype``), each sharded one in ``shards`` gathered.
    A ``torch.optim.Optimizer`` (one group, its ``lr`` read at each step): torch's schedulers drive it as they drive
    torch's Muon."""

    def __init__(self, named: list, spec: MuonSpec, dtype: torch.dtype, shards: dict):
        super().__init__([p for _, p in named], {"lr": spec.lr})
        self.named, self.spec, self.dtype, self.shards = named, spec, dtype, shards

    @torch.no_grad()
    def step(self, closure=None) -> None:
        spec = at_lr(self.spec, self.param_groups[0]["lr"])  # a scheduler's lr, as torch's Muon reads its group's
        for name, p in self.named:  # the same order on every rank of a group: the gathers pair up
            if p.grad is None:
                continue
            buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
            update = gathered(muon_update(spec, p.grad, buf), self.shards.get(id(p)))
            p.mul_(1 - spec.lr * spec.weight_decay)
            for step, lr in block_steps(spec, name, update, p.shape, self.shards.get(id(p)), self.dtype):
                p.add_(step, alpha=-lr)


class _State(MutableMapping):
    """Both optimizers' ``state`` as one mapping, each parameter's in the optimizer whose groups hold it."""

    def __init__(self, optimizers: list, owners: dict):
        self.optimizers, self.owners = optimizers, owners

    def _owner(self, p):
        if id(p) not in self.owners:
            raise KeyError("not a parameter of this optimizer")
        return self.owners[id(p)]

    def __getitem__(self, p):
        return self._owner(p).state[p]

    def __setitem__(self, p, value) -> None:
        self._owner(p).state[p] = value

    def __delitem__(self, p) -> None:
        del self._owner(p).state[p]

    def __iter__(self):
        return (p for opt in self.optimizers for p in opt.state)

    def __len__(self) -> int:
        return sum(len(opt.state) for opt in self.optimizers)


class MuonAdamW:
    """Muon for ``named``'s hidden matrices (``spec.takes``), AdamW for the rest."""

    def __init__(self, named, spec: MuonSpec, ns_dtype: torch.dtype = torch.bfloat16, shards: dict | None = None,
                 reference: bool = False):
        """``reference``: the reference iteration even where torch's Muon would step (their bitwise equality is
        tested: suites/muon/test_optimizer.py)."""
        named, shards = list(named), shards or {}
        matrices = [(n, p) for n, p in named if spec.takes(n, p.shape)]
        rest = [p for n, p in named if not spec.takes(n, p.shape)]
        self.spec, self.optimizers = spec, []
        if matrices:
            torchs = ns_dtype == torch.bfloat16 and not shards and not spec.parts and not reference \
                and torch_adjusts(spec.adjust_lr_fn)  # else the reference iteration (bitwise torch's where both run)
            self.matrices = torch.optim.Muon(
                [p for _, p in matrices], lr=spec.lr, weight_decay=spec.weight_decay, momentum=spec.momentum,
                nesterov=spec.nesterov, ns_steps=spec.ns_steps, adjust_lr_fn=spec.adjust_lr_fn) if torchs else \
                ReferenceMatrices(matrices, spec, ns_dtype, shards)
            self.optimizers.append(self.matrices)
        if rest:
            self.optimizers.append(spec.adamw(rest))
        self.owners = {id(p): opt for opt in self.optimizers for g in opt.param_groups for p in g["params"]}
        """id(parameter) -> the optimizer that steps it (its groups are fixed at construction)."""

    @property
    def state(self) -> _State:
        """{parameter: its state} of both optimizers (setting a parameter's sets it in the optimizer that steps it)."""
        return _State(self.optimizers, self.owners)

    @property
    def param_groups(self) -> list:
        return [g for opt in self.optimizers for g in opt.param_groups]

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)
