"""torch's Muon through the Muon contract: ``torch.optim.Muon`` for the matrices the spec gives Muon, ``AdamW`` for
the rest, on DTensor parameters over a one-dimensional mesh of the group — ``Shard(0)`` (rows: FSDP2's sharding, a
column-parallel layer's), ``Shard(1)`` (cols: a row-parallel layer's; a vector ``Shard(0)``) or ``Replicate()``.
torch's Muon then runs its Newton-Schulz on the DTensor: every matmul and the norm over the whole logical matrix,
DTensor redistributing as its sharding rules say."""

from __future__ import annotations

import torch

from reference.errors import Unsupported
from reference.muon.spec import torch_lacks


def _placement(layout: str, dims: int):
    from torch.distributed.tensor import Replicate, Shard

    return {"replicated": Replicate(), "rows": Shard(0), "cols": Shard(1 if dims == 2 else 0)}[layout]


class TorchMuon:
    description = "torch.optim.Muon + AdamW on DTensor parameters (Shard(0), Shard(1), Replicate())"

    def shard(self, params: dict, spec, layout: str, group):
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import distribute_tensor

        from harness.runtime.rank import rank_device

        if layout == "flat":
            raise Unsupported("torch's Muon steps whole parameters (one DTensor each); a flat ZeRO shard straddling "
                              "parameters is no matrix (DeepSpeed's and Megatron's distributed optimizers are flat).")
        if why := torch_lacks(spec.adjust_lr_fn):
            raise Unsupported(why)
        if spec.parts:
            raise Unsupported("torch's Muon orthogonalises each parameter whole: a fused matrix's logical parts "
                              "(QKV, gate + up) would be orthogonalised as one — they train as separate parameters.")
        mesh = DeviceMesh.from_group(group, rank_device().type)
        dt = {k: torch.nn.Parameter(distribute_tensor(v.to(rank_device()), mesh, [_placement(layout, v.dim())]))
              for k, v in params.items()}
        muon = [dt[k] for k in dt if spec.takes(k, dt[k].shape)]
        rest = [dt[k] for k in dt if not spec.takes(k, dt[k].shape)]
        optimizers = [torch.optim.Muon(muon, lr=spec.lr, weight_decay=spec.weight_decay, momentum=spec.momentum,
                                       nesterov=spec.nesterov, ns_steps=spec.ns_steps, adjust_lr_fn=spec.adjust_lr_fn)]
        optimizers += [spec.adamw(rest)] if rest else []
        return {"params": dt, "optimizers": optimizers, "mesh": mesh}

    def step(self, state, grads: dict) -> None:
        from torch.distributed.tensor import DTensor

        for k, p in state["params"].items():
            p.grad = DTensor.from_local(grads[k].to(p.device), state["mesh"], p.placements, shape=p.shape,
                                        stride=p.stride())
        for opt in state["optimizers"]:
            opt.step()
            opt.zero_grad()

    def full(self, state) -> dict:
        return {k: p.detach().full_tensor().cpu() for k, p in state["params"].items()}
