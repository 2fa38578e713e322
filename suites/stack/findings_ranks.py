"""Rank side of test_findings.py: the minimal cases of third-party behaviour the stack suite found."""

from __future__ import annotations

import torch


def fsdp_pipeline_grads_over_two_schedules(reuse: bool) -> dict:
    """One FSDP2-wrapped Linear as a one-stage pipeline: a step of one schedule, then a step of the same
    schedule (``reuse``) or of a new one over the same PipelineStage, without zeroing the gradients in
    between. Returns whether the gradient is the two passes' sum, or the second pass's alone."""
    from torch.distributed import pipelining
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2, dtype=torch.float64)
    x1, x2 = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    fully_shard(lin, mesh=init_device_mesh("cpu", (1,)))
    stage = pipelining.PipelineStage(lin, 0, 1, torch.device("cpu"))

    def loss_fn(out, target):
        return out.sum()

    first = pipelining.ScheduleGPipe(stage, 1, loss_fn=loss_fn, scale_grads=False)
    first.step(x1, target=torch.zeros(2))
    second = first if reuse else pipelining.ScheduleGPipe(stage, 1, loss_fn=loss_fn, scale_grads=False)
    second.step(x2, target=torch.zeros(2))
    got = lin.weight.grad.full_tensor()
    one, two = x1.sum(0).expand(2, 3), x2.sum(0).expand(2, 3)  # d(sum(W x + b))/dW per pass
    return {"sum": bool(torch.allclose(got, one + two)), "second_only": bool(torch.allclose(got, two))}


def inf_norm_of_an_empty_fsdp_shard() -> str | None:
    """FSDP2 over the World of a Linear(3, 1): its (1, 3) weight's shard on rank 1 is empty. The inf norm of
    the gradients (torch.nn.utils.get_total_norm, torchtitan's clip_grad_norm_): the error this rank raised,
    or None."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 1, bias=False, dtype=torch.float64)
    fully_shard(lin, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    lin(torch.ones(2, 3, dtype=torch.float64)).sum().backward()
    from harness.runtime.rank import failed_in_implementation

    try:
        torch.nn.utils.get_total_norm([lin.weight.grad], float("inf")).full_tensor()
    except RuntimeError as exc:  # its peer waits in the reduction: the World ends it after the grace
        return failed_in_implementation(f"rank {dist.get_rank()}: {str(exc).splitlines()[0]}")
    return None


def compiled_tp_block_after_a_tp_embedding(fsdp: bool, backend: str = "inductor",
                                           sequence_parallel: bool = False) -> str:
    """An embedding split over 2 TP ranks (``RowwiseParallel``, Replicate in and out: torchtitan's without sequence
    parallelism) feeding a residual MLP whose up / down projections are Colwise / Rowwise and which is compiled
    (``nn.Module.compile`` with ``backend``), optionally under FSDP2 over a data-parallel mesh of one rank; one
    backward of the sum of squares. Returns "zero" (the embedding's gradient is all zeros), "equal" (it is one
    device's), "off" or "raised <error>". ``sequence_parallel``: torchtitan's plan with it — the embedding's output
    the rank's share of the sequence (Shard(1)), gathered by the up projection, reduce-scattered by the down one."""
    import copy

    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(8, 16, bias=False), nn.Linear(16, 8, bias=False)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.mlp = nn.Embedding(10, 8), MLP()

        def forward(self, tokens):
            return self.mlp(self.embed(tokens)).pow(2).sum()

    torch.manual_seed(0)
    one = Net()
    net = copy.deepcopy(one)
    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
    between = Shard(1) if sequence_parallel else Replicate()
    parallelize_module(net.embed, mesh["tp"], RowwiseParallel(input_layouts=Replicate(), output_layouts=between))
    parallelize_module(net.mlp, mesh["tp"], {"up": ColwiseParallel(input_layouts=between),
                                             "down": RowwiseParallel(output_layouts=between)})
    net.mlp.compile(backend=backend)
    if fsdp:
        fully_shard(net.mlp, mesh=mesh["dp"])
        fully_shard(net, mesh=mesh["dp"])
    tokens = torch.tensor([[1, 2, 3, 4]])
    one(tokens).backward()
    try:
        net(tokens).backward()
    except Exception as exc:  # noqa: BLE001 - the behaviour watched
        return f"raised {type(exc).__name__}: {exc}"
    got, want = net.embed.weight.grad.full_tensor(), one.embed.weight.grad
    return "zero" if not got.any() else "equal" if torch.allclose(got, want) else "off"


def ddp_pipeline(schedule: str, microbatches: int, pp: int = 1, steps: int = 2) -> dict:
    """A float64 Linear(3, 3) per stage in torch's ``DistributedDataParallel`` over the data-parallel group of a
    (dp, pp) mesh, pipelined by ``schedule`` (the torch stack's name for torch's class: one stage a rank, or two under
    the interleaved and V-shaped schedules, placed as ``reference.pipeline.placement`` places them) over
    ``microbatches``; each replica its own batch, ``steps`` steps (1 or 2) with the gradients zeroed between them.
    Returns {"agree": whether after step 1 the replicas of each of this rank's stages hold the same gradient (DDP's
    all-reduce: equal bitwise) — one bool, or a list of them in stage order with two stages, "step <i>": "ok" or
    "raised <error>" (``harness.errors.describe``: with the error it was raised from)}."""
    import torch.distributed as dist
    from torch.distributed import pipelining
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.parallel import DistributedDataParallel

    from harness.adapters.torch.stack_trainer import SCHEDULES, SINGLE  # the torch stack's: torch's classes
    from reference.pipeline.generators import placement, stages_per_rank

    dp, v = dist.get_world_size() // pp, stages_per_rank(schedule, 2)
    mesh = init_device_mesh("cpu", (dp, pp), mesh_dim_names=("dp", "pp"))
    mine = [s for s, r in enumerate(placement(schedule, pp, v)) if r == mesh.get_local_rank("pp")]
    torch.manual_seed(0)  # every replica's stages the same
    lins = [torch.nn.Linear(3, 3, dtype=torch.float64) for _ in mine]
    stages = [pipelining.PipelineStage(DistributedDataParallel(lin, process_group=mesh["dp"].get_group()), s, pp * v,
                                       torch.device("cpu"), group=mesh["pp"].get_group())
              for s, lin in zip(mine, lins, strict=True)]

    def loss_fn(out, target):
        return (out - target).pow(2).sum()

    schedule_ = getattr(pipelining, SCHEDULES[schedule])(stages[0] if schedule in SINGLE else stages, microbatches,
                                                         loss_fn=loss_fn, scale_grads=False)
    first, last = 0 in mine, pp * v - 1 in mine
    out: dict = {}
    for step in range(1, steps + 1):
        torch.manual_seed(100 * step + mesh.get_local_rank("dp"))  # each replica's own batch
        x, y = torch.randn(2 * microbatches, 3, dtype=torch.float64), torch.randn(2 * microbatches, 3,
                                                                                 dtype=torch.float64)
        for lin in lins:
            lin.zero_grad()
        try:
            schedule_.step(*((x,) if first else ()), **({"target": y} if last else {}))
        except Exception as exc:  # noqa: BLE001 - the behaviour watched
            from harness.errors import describe

            out[f"step {step}"] = f"raised {describe(exc)}"
            return out
        out[f"step {step}"] = "ok"
        if step == 1:
            agree = []
            for lin in lins:
                grads = [torch.zeros(12, dtype=torch.float64) for _ in range(dp)]
                dist.all_gather(grads, torch.cat([lin.weight.grad.flatten(), lin.bias.grad]),
                                group=mesh["dp"].get_group())
                agree.append(all(torch.equal(g, grads[0]) for g in grads))
            out["agree"] = agree[0] if len(agree) == 1 else agree
    return out
