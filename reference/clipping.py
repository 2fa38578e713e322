"""Global gradient-norm clipping for sharded models: the norm one device would compute, on every rank.

The whole model's gradient is spread over the ranks; each element must enter the norm exactly once:
- tensor parallelism: a split parameter (``tensor_parallel.tp_sharded_parameters``) holds a different
  part on each TP rank — its terms are summed over the TP group; a replicated one (LayerNorms, a
  row-parallel bias) holds the same gradient on every TP rank — counted on TP rank 0 only (counting it
  tp times is TransformerEngine PR 715's bug: the norm 1.52x too high);
- pipeline parallelism: stages hold disjoint parameters — summed over the PP group (leaving it out is
  torchtitan #596's: each stage clips by its own norm);
- data parallelism: a ZeRO shard (``dp_sharded``) is this DP rank's part of the averaged gradient —
  summed over the DP group; an all-reduced (ZeRO 0) gradient is the same on every DP rank — counted on
  DP rank 0 only.
Every rank then sums the partial terms over all three groups (an all-reduce each; max for the inf norm)
and scales all its gradients — replicated copies included — by min(1, max_norm / (norm + 1e-6)), the
factor ``torch.nn.utils.clip_grad_norm_`` applies on one device.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from reference.stack.topology import all_reduce_over


def _rank(groups: dict, kind: str) -> int:
    return dist.get_rank(groups[kind]) if kind in groups else 0


def grad_norm(params, groups: dict, norm_type: float = 2.0, *, tp_sharded=(), dp_sharded=(),
              counted: dict | None = None) -> torch.Tensor:
    """The global ``norm_type`` norm (2 or inf) of the gradients of ``params`` (this rank's), as one device
    computes it over the whole model. ``groups``: {"tp", "pp", "dp"} process groups (a missing key: that
    dimension has size 1; the value None: the default group). ``tp_sharded``: the parameters split over
    TP (the rest are replicated over it). ``dp_sharded``: parameters whose ``grad`` is this rank's ZeRO
    shard (the rest are all-reduced replicas).
    ``counted``: {id(parameter): bool tensor like its grad}, the elements this rank counts, for a flat shard
    that mixes split and replicated parameters (it overrides the TP rule for that parameter)."""
    if norm_type not in (2.0, math.inf):
        raise ValueError(f"norm_type must be 2 or inf; got {norm_type}.")
    tp_ids, dp_ids, counted = {id(p) for p in tp_sharded}, {id(p) for p in dp_sharded}, counted or {}
    tp_first, dp_first = _rank(groups, "tp") == 0, _rank(groups, "dp") == 0
    total, device = None, None
    for p in params:
        if p.grad is None:
            continue
        g, device = p.grad.detach(), p.grad.device
        if id(p) in counted:
            g = g[counted[id(p)]]
        elif not (id(p) in tp_ids or tp_first):
            continue
        if not (id(p) in dp_ids or dp_first):
            continue
        if not g.numel():
            continue
        term = (g.abs().max() if norm_type == math.inf else (g.double() ** 2).sum()).double()
        total = term if total is None else (torch.maximum(total, term) if norm_type == math.inf else total + term)
    total = torch.zeros((), dtype=torch.float64, device=device) if total is None else total
    total = total.reshape(1)
    all_reduce_over(total, groups, dist.ReduceOp.MAX if norm_type == math.inf else dist.ReduceOp.SUM)
    return total[0] if norm_type == math.inf else total[0].sqrt()


def clip_grad_norm_(params, max_norm: float, groups: dict, norm_type: float = 2.0, *, tp_sharded=(),
                    dp_sharded=(), counted: dict | None = None) -> torch.Tensor:
    """Scale every gradient of ``params`` so that the global norm (``grad_norm``, same arguments) is at
    most ``max_norm``; returns the norm before clipping (float64), the same on every rank."""
    if not max_norm > 0:
        raise ValueError(f"max_norm must be positive; got {max_norm}.")
    params = list(params)
    norm = grad_norm(params, groups, norm_type, tp_sharded=tp_sharded, dp_sharded=dp_sharded, counted=counted)
    coef = min(1.0, max_norm / (float(norm) + 1e-6))
    for p in params:
        if p.grad is not None:
            p.grad.detach().mul_(coef)
    return norm
