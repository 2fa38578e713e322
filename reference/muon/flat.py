"""Muon over ZeRO 1/2's flat shard: the optimizer ``reference.zero.ShardedOptimizer`` steps when the spec is Muon's.

The rank's master is its range of the flat buffer (``reference.zero.flat``): parameters laid end to end, a range
boundary falling anywhere inside one. AdamW's elements (embedding, head, vectors) step where they are, elementwise,
as ZeRO steps any optimizer. A Muon matrix's momentum is elementwise too, but its update is orthogonalised whole:
every rank's range of the updates is all-gathered over the ZeRO group (the ``gather`` strategy: each rank then holds
every matrix of its module — under tensor parallelism its block, all-gathered over the TP group as at ZeRO 0), each
matrix orthogonalised per logical part — every rank the same arithmetic on the same matrix — and each rank applies
the part of it in its range. Communication per step: one all-gather of the flat buffer beyond ZeRO's own (Psi
elements: ``cost_model.muon_step_bytes``' flat layout), plus TP's gathers of the matrices it splits."""

from __future__ import annotations

from collections.abc import MutableMapping

import torch
from torch import nn

from .optimizer import block_steps, gathered
from .spec import MuonSpec, at_lr, muon_update


class _MasterState(MutableMapping):
    """``{master: its state}`` — one dict holding Muon's ``momentum_buffer`` and AdamW's ``exp_avg``, ``exp_avg_sq``
    and ``step``, each (but ``step``) shaped as the master, zero where the other optimizer's elements are. It is
    AdamW's own state dict of the master (setting it, as a resume does, sets AdamW's)."""

    def __init__(self, owner: FlatMuon):
        self.owner = owner

    def __getitem__(self, p):
        if p is not self.owner.master:
            raise KeyError("not this optimizer's master")
        return self.owner.adamw.state[self.owner.master]

    def __setitem__(self, p, value) -> None:
        if p is not self.owner.master:
            raise KeyError("not this optimizer's master")
        self.owner.adamw.state[self.owner.master] = dict(value)

    def __delitem__(self, p) -> None:
        raise TypeError("a flat Muon's state is kept while it trains")

    def __iter__(self):
        return iter([self.owner.master])

    def __len__(self) -> int:
        return 1


class FlatMuon:
    """Muon + AdamW stepping ``master`` (an ``nn.Parameter`` viewing this rank's range of ``flat``'s buffer) from
    ``master.grad``; ``named``: the flat's parameters with their names (in ``flat.params``' order: Muon's rule reads
    the names), ``shards`` ({id(param): (dim, group, replicas)}: ``tp_split_matrices``), ``dtype`` the Newton-Schulz
    precision."""

    def __init__(self, master: nn.Parameter, flat, named: list, spec: MuonSpec, dtype: torch.dtype, shards: dict):
        if [id(p) for _, p in named] != [id(p) for p in flat.params]:
            raise ValueError("a flat Muon needs the flat buffer's parameters, named, in its order.")
        self.master, self.flat, self.spec, self.dtype, self.shards = master, flat, spec, dtype, shards
        lo = flat.shard.start
        self.matrices, adamw_ranges = [], []
        for (name, p), offset in zip(named, flat.offsets, strict=True):
            a, b = max(offset, lo), min(offset + p.numel(), lo + flat.shard_size)
            if spec.takes(name, p.shape):
                self.matrices.append((name, p, offset, slice(a - lo, b - lo) if a < b else None))
            elif a < b:
                adamw_ranges.append(slice(a - lo, b - lo))
        self.muon_mask = torch.ones(flat.shard_size, dtype=torch.bool, device=master.device)
        for r in adamw_ranges:
            self.muon_mask[r] = False
        """This rank's elements that are not AdamW's: the Muon matrices' (and the padding, which stays 0)."""
        self.adamw = spec.adamw([master])
        zeros = torch.zeros_like(master.data)
        self.adamw.state[master] = {"step": torch.tensor(0.0), "exp_avg": zeros.clone(), "exp_avg_sq": zeros.clone(),
                                    "momentum_buffer": zeros.clone()}
        self.param_groups = [{"params": [master], "lr": spec.lr}, self.adamw.param_groups[0]]
        """Muon's group (its lr read at each step) and its AdamW's: a scheduler sets both (``zero.set_lr``)."""

    @property
    def state(self) -> _MasterState:
        return _MasterState(self)

    @torch.no_grad()
    def step(self) -> None:
        spec, m, grad = at_lr(self.spec, self.param_groups[0]["lr"]), self.master.data, self.master.grad
        if grad is None:
            return
        st = self.adamw.state[self.master]
        update = muon_update(spec, grad, st["momentum_buffer"])  # elementwise: this rank's range of the one device's
        st["momentum_buffer"].masked_fill_(~self.muon_mask, 0)
        whole = self.flat.gather(update.masked_fill(~self.muon_mask, 0))  # every matrix's update, this rank's block
        kept = m[self.muon_mask].clone()
        self.adamw.step()  # elementwise over the range; the Muon elements put back after it
        m[self.muon_mask] = kept
        st["exp_avg"].masked_fill_(self.muon_mask, 0)
        st["exp_avg_sq"].masked_fill_(self.muon_mask, 0)
        for name, p, offset, mine in self.matrices:  # the same order on every rank: the TP gathers pair up
            local = whole[offset:offset + p.numel()].view_as(p)
            full = gathered(local, self.shards.get(id(p)))
            if mine is None:
                continue
            held = m[mine]
            held.mul_(1 - spec.lr * spec.weight_decay)
            at = slice(mine.start + self.flat.shard.start - offset, mine.stop + self.flat.shard.start - offset)
            for step, lr in block_steps(spec, name, full, p.shape, self.shards.get(id(p)), self.dtype):
                held.add_(step.flatten()[at], alpha=-lr)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.master.grad = None
