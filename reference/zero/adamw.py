"""AdamW over flat shards: the elements of one tensor decay or not, by the parameter each belongs to.

ZeRO's flat shard (``reference.zero.flat``) lays parameters end to end, a range boundary anywhere inside one; AdamW's
rule "matrices" (``OptimizerSpec.decay``) decays the elements of the matrices and not those of the biases and norms
beside them. torch's AdamW decays a tensor whole: each step, before Adam's update, ``param.mul_(1 - lr *
weight_decay)``. ``MaskedAdamW`` multiplies each element by that factor where its mask holds and by 1 elsewhere (exact:
the same product, in the parameter's own arithmetic), then takes Adam's step — torch's Adam, whose update does not read
the parameter: bitwise torch's AdamW on the parameters one by one. Its state is Adam's (``exp_avg``, ``exp_avg_sq``,
``step``), so a resume reads it as it reads any Adam's."""

from __future__ import annotations

import torch


class MaskedAdamW(torch.optim.Adam):
    """torch's Adam over ``params`` (tensors), each first decayed where ``masks`` (bool, one per tensor, its shape)
    hold: AdamW with ``weight_decay`` over the masked elements alone."""

    def __init__(self, params, masks, lr: float, betas, eps: float, weight_decay: float):
        params = list(params)
        masks = list(masks)
        if len(masks) != len(params) or any(m.shape != p.shape for p, m in zip(params, masks, strict=True)):
            raise ValueError("MaskedAdamW needs one mask per tensor, shaped like it.")
        super().__init__(params, lr=lr, betas=betas, eps=eps)
        self.masks, self.weight_decay = masks, weight_decay

    @torch.no_grad()
    def step(self, closure=None):
        lr = self.param_groups[0]["lr"]
        for p, mask in zip(self.param_groups[0]["params"], self.masks, strict=True):
            if p.grad is not None:  # torch's AdamW decays only what it steps
                # torch multiplies by the Python float 1 - lr * wd, which a float32 (or bf16) kernel computes in
                # float32, a float64 one in float64: the factor is held in that arithmetic
                dtype = torch.float64 if p.dtype == torch.float64 else torch.float32
                p.mul_(torch.ones(p.shape, dtype=dtype, device=p.device).masked_fill_(mask, 1 - lr * self.weight_decay))
        return super().step(closure)
