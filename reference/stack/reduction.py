"""How the composed trainer's gradients become its update — the reduction strategies, out of the step
(``reference.stack.compose.Parallel3D``): ZeRO 0 (the gradients all-reduced, one optimizer), ZeRO 1 / 2 (reduce-
scattered into a flat shard that its optimizer steps), mixed precision (fp32 masters), and the experts (ep > 1)
reduced over their expert-data-parallel group instead of dp (x cp).

One device's expert gradient is the sum over its EDP group of what each EP group collected, / (dp cp)
(``reference.expert_parallel``'s derivation) — dividing by the EDP size (dp cp / ep) instead is pytorch #160285's
ep x. ZeRO 0 in full precision: NaiveDataParallel averages over the EDP group, so each collected gradient is first
divided by ep (``reduce``); else the reduction's divisor is dp cp.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from reference.data_parallel import NaiveDataParallel
from reference.models.sharding import counted_here
from reference.stack.dimensions import data_parallel
from reference.tensor_parallel import tp_sharded_parameters


@dataclass
class DataPart:
    """One data-parallel reduction of a rank's parameters: which, their synchroniser (``data_parallel``'s), the
    optimizer that steps them, and the group they are replicated (and ZeRO-sharded) over."""

    params: list
    sync: object
    optimizer: torch.optim.Optimizer
    group: object


class _Holding(nn.Module):
    """Some of a module's parameters (the same objects) — what one data-parallel reduction covers."""

    def __init__(self, params):
        super().__init__()
        self.held = nn.ParameterList(params)


class Reduction:
    """This rank's data-parallel parts (``DataPart``: the dense parameters over dp x cp; the experts over their EDP
    group), reduced and updated one way per recipe."""

    def __init__(self, local: nn.Module, optimizer, zero_stage: int, mixed: bool, groups: dict, ep: int,
                 reduce_dtype=None):
        self.local, self.zero_stage, self.mixed, self.groups, self.ep = local, zero_stage, mixed, groups, ep
        self.dp_group = groups.get("dp_cp", groups["dp"])
        """Where gradients are reduced and ZeRO shards: dp, or dp x cp (parameters are replicated over cp)."""
        self.zero_group = groups.get("dp_shard", self.dp_group)
        """Where ZeRO shards: ``dp_group``, or under hybrid sharding its shard group (each reduced shard all-reduced
        across "dp_replicate")."""
        self.experts = [p for p in local.parameters() if getattr(p, "expert_of", None) is not None]
        """Parameters split over the EP group (ep > 1): reduced over the expert-data-parallel group instead."""
        dense = local if not self.experts else _Holding(
            [p for p in local.parameters() if getattr(p, "expert_of", None) is None])
        self.sync, self.optimizer = data_parallel(dense, optimizer, zero_stage, self.zero_group, reduce_dtype,
                                                  replicate=groups.get("dp_replicate"))
        self.expert_sync = expert_optimizer = None
        if self.experts:
            if zero_stage == 0 and not mixed:  # one optimizer over the dense parameters and the experts
                self.expert_sync = NaiveDataParallel(_Holding(self.experts), groups["edp"])
                self.optimizer = expert_optimizer = optimizer.build(local.parameters())
            else:
                self.expert_sync, expert_optimizer = data_parallel(
                    _Holding(self.experts), optimizer, zero_stage, groups["edp"], reduce_dtype,
                    divisor=dist.get_world_size(self.dp_group))
        self.parts = [DataPart(list(dense.parameters()), self.sync, self.optimizer, self.dp_group)] + (
            [DataPart(self.experts, self.expert_sync, expert_optimizer, groups["edp"])] if self.experts else [])
        """Each data-parallel reduction of this rank's parameters: the dense ones over dp (x cp); the experts
        (ep > 1) over their expert-data-parallel group, their state sharded over it (ZeRO 1/2)."""

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return list({id(part.optimizer): part.optimizer for part in self.parts}.values())

    def reduce(self, scale: float) -> list[torch.Tensor]:
        """The DP reduction; returns the gradients the optimizer steps from, divided by ``scale``."""
        if self.mixed:
            grads = []
            for part in self.parts:
                part.sync.reduce()
                grads += part.sync.unscale(scale)
            return grads
        if self.zero_stage == 0:
            self.sync.finish()
            if self.experts:
                for p in self.experts:
                    if p.grad is not None:
                        p.grad.mul_(1.0 / self.ep)
                self.expert_sync.finish()
            grads = [p.grad for p in self.local.parameters() if p.grad is not None]
        else:
            grads = []
            for part in self.parts:
                part.sync.reduce()
                grads.append(part.sync.master.grad)
        if scale != 1.0:
            for g in grads:
                g.mul_(1.0 / scale)
        return grads

    def update(self) -> None:
        """The optimizer step of every part (mixed precision: the fp32 masters, then the low-precision copies)."""
        if self.mixed:
            for part in self.parts:
                part.sync.apply()
        elif self.zero_stage == 0:
            self.optimizer.step()
        else:
            for part in self.parts:
                part.sync.update()

    def norm_terms(self, copy_: set) -> tuple[list, dict]:
        """What ``clip_grad_norm_`` needs: this rank's gradient holders and which are split where. ZeRO 0:
        the local parameters; ZeRO 1/2: the rank's flat shard, with the elements of parameters replicated
        over TP counted on TP rank 0 only."""
        split = {id(p) for p in tp_sharded_parameters(self.local) + counted_here(self.local)}
        if self.zero_stage == 0 and not self.mixed:  # a tied head is the embedding's copy: counted once, there
            params = list(self.local.parameters())
            skip = {id(p): torch.zeros_like(p, dtype=torch.bool) for p in params if id(p) in copy_}
            # an expert (ep > 1): one EP group's ranks hold every expert once — counted on EDP rank 0 (and TP
            # rank 0: experts are replicated over TP), summed over dp x cp as a shard is
            here = bool(self.experts) and dist.get_rank(self.groups["edp"]) == 0 and \
                dist.get_rank(self.groups["tp"]) == 0
            skip.update({id(p): torch.full_like(p, here, dtype=torch.bool) for p in self.experts})
            return params, {"tp_sharded": [p for p in params if id(p) in split], "counted": skip,
                            "dp_sharded": self.experts}
        first = dist.get_rank(self.groups["tp"]) == 0
        masters, sharded, counted = [], [], {}
        for part in self.parts:
            flat, expert = part.sync.flat, part.group is not self.dp_group
            mask = torch.zeros(flat.padded, dtype=torch.bool, device=flat.buffer.device)
            for p, view in zip(flat.params, flat.views(mask), strict=True):
                view.fill_((id(p) in split or first) and id(p) not in copy_)
            if self.mixed and not self.zero_stage:  # the whole flat fp32 master, replicated over its group:
                master = part.sync.masters[0]  # the dense one counted once; the experts' on EDP rank 0 (each EP
                mask &= not expert or dist.get_rank(part.group) == 0  # group's distinct), summed over dp x cp
                sharded += [master] if expert else []
                counted[id(master)] = mask
            else:  # this rank's shard of the flat (an expert's: of its EDP group's), summed over dp x cp
                master = part.sync.masters[0] if self.mixed else part.sync.master
                sharded.append(master)
                counted[id(master)] = mask[flat.shard]
            masters.append(master)
        return masters, {"dp_sharded": sharded, "counted": counted}
