"""A pipeline implementation to copy from: GPipe (all forwards, then all backwards) over blocking
point-to-point send/recv, one stage per rank. Run it through the suite with

    pytest suites/pipeline --impl docs.examples.gpipe_pipeline:GPipeOnly

Every other schedule, and more than one stage per rank, is ``Unsupported`` (reported, not failed).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.contracts import Unsupported


class GPipeOnly:
    """The pipeline contract (harness/contracts/pipeline.py) for schedule "gpipe" only."""

    def build(self, stages, num_stages, schedule, num_microbatches, virtual_stages, loss_fn, batch_size,
              sample_shape, group=None):
        if schedule != "gpipe" or virtual_stages != 1:
            raise Unsupported(f"this example runs gpipe with one stage per rank, not {schedule} "
                              f"with {virtual_stages} stage(s) per rank.")
        (stage, module), = stages.items()
        return _GPipeStep(module, stage, num_stages, num_microbatches, loss_fn, batch_size, tuple(sample_shape),
                          group)


class _GPipeStep:
    def __init__(self, module, stage, num_stages, m, loss_fn, batch_size, sample_shape, group):
        self.module, self.stage, self.last, self.m, self.loss_fn = module, stage, num_stages - 1, m, loss_fn
        self.shape = sample_shape
        # tensor_split's row counts, known to every rank without communication (some may be 0)
        self.rows = [len(c) for c in torch.arange(batch_size).tensor_split(m)]
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        self.prev = ranks[stage - 1] if stage > 0 else None
        self.next = ranks[stage + 1] if stage < self.last else None
        param = next(module.parameters())
        self.like = {"dtype": param.dtype, "device": param.device}

    def step(self, inputs, targets):
        xs = inputs.tensor_split(self.m) if self.stage == 0 else None
        ts = targets.tensor_split(self.m) if self.stage == self.last else None
        ins, outs = [], []
        for i, rows in enumerate(self.rows):  # forward every microbatch
            if rows == 0:  # an empty microbatch: nothing to compute or send, on every stage alike
                ins.append(None), outs.append(None)
                continue
            if self.prev is None:
                x = xs[i]
            else:
                x = torch.empty((rows, *self.shape), **self.like)
                dist.recv(x, src=self.prev)
                x.requires_grad_()
            y = self.module(x)
            if self.next is None:
                y = self.loss_fn(y, ts[i])  # sum-reduced: gradients accumulate as a sum, no 1/m
            else:
                dist.send(y.detach(), dst=self.next)
            ins.append(x), outs.append(y)
        for i in reversed(range(self.m)):  # then every backward, last microbatch first
            if outs[i] is None:
                continue
            if self.next is None:
                outs[i].backward()
            else:
                grad = torch.empty_like(outs[i])
                dist.recv(grad, src=self.next)
                outs[i].backward(grad)
            if self.prev is not None:
                dist.send(ins[i].grad, dst=self.prev)
        if self.next is None:
            return torch.stack([o.detach() for o in outs if o is not None]).sum()
        return None
