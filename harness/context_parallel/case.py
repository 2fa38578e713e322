"""The context-parallel conformance case (inputs, oracle, check; rank side): the Llama family's attention
over the World as the CP group, this rank's sequence shard in, held to one device's attention over the
whole sequence.

Inputs: ``GQAttention(hidden, heads, kv_heads, causal)`` from ``seed`` (its q and k weights times
``logit_scale``: scores large enough that a softmax merged without the running maximum overflows float64
at exp(709.8)), x and an upstream gradient g (batch, seq, hidden) — the same on every rank. Oracle: one
device, y = dense(x, arange(seq)), (y g).sum() backward: y, dx and every weight's gradient. Check: this
rank's shard of y and of dx, and every ``full_grads`` tensor, within ``bound`` x the tensor's largest
magnitude; the dense module unchanged.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from harness.runtime.rank import rank_device

from ..errors import describe
from ..verdict import U64, attempt, checked, compared, failed, failed_here, off  # noqa: F401 - failed: run_or_fail's verdict of a failed call


@dataclass(frozen=True)
class Case:
    hidden: int = 16
    heads: int = 4
    kv_heads: int = 2
    seq: int = 8
    batch: int = 2
    causal: bool = True
    layout: str = "zigzag"
    logit_scale: float = 1.0
    seed: int = 0

    def label(self) -> str:
        return (f"h{self.heads}kv{self.kv_heads}-s{self.seq}b{self.batch}-{self.layout}-"
                f"{'causal' if self.causal else 'full'}{f'-x{self.logit_scale:g}' if self.logit_scale != 1 else ''}")


def bound(case: Case, cp: int, s_max: float) -> float:
    """Largest allowed difference from one device, relative to each tensor's largest magnitude. Every
    element is a chain of sums that the parallel run orders differently: the projections (hidden terms in,
    heads x d out), a score (d terms: its absolute error d u s_max, which exp turns into a relative error
    of the probability — the softmax is as sensitive as its largest score), the softmax's normaliser and
    the weighted sum of values (seq terms each, regrouped into cp blocks whose merge rescales by
    exp(m_block - m) — 3 roundings per block); each within its term count x u of the magnitudes summed.
    So (hidden + heads d + d (1 + s_max) + seq + 3 cp) u per stage; x 4 stages chained (projection, score,
    softmax, output) and x 2 for backward, which runs the same chains transposed; x 4 for the magnitudes
    summed over the result's (cancellation): 32 x."""
    d = case.hidden // case.heads
    return 32 * (case.hidden + case.heads * d + d * (1 + s_max) + case.seq + 3 * cp) * U64


def _inputs(case: Case, device):
    from reference.models import GQAttention

    torch.manual_seed(case.seed)
    dense = GQAttention(case.hidden, case.heads, case.kv_heads, causal=case.causal).to(device)
    with torch.no_grad():
        dense.q.weight.mul_(case.logit_scale)
        dense.k.weight.mul_(case.logit_scale)
    gen = torch.Generator().manual_seed(case.seed + 1)
    x = torch.randn(case.batch, case.seq, case.hidden, generator=gen, dtype=torch.float64).to(device)
    g = torch.randn(case.batch, case.seq, case.hidden, generator=gen, dtype=torch.float64).to(device)
    return dense, x, g


def _one_device(dense, x, g, case: Case):
    """(y, dx, {name: grad}, the largest |score|) of the whole sequence on one device."""
    from reference.models.llama import rotate

    xd = x.clone().requires_grad_()
    for p in dense.parameters():
        p.grad = None
    y = dense(xd, torch.arange(case.seq, device=x.device))
    (y * g).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in dense.named_parameters()}
    for p in dense.parameters():
        p.grad = None
    with torch.no_grad():
        b, s, d = case.batch, case.seq, dense.head_dim
        pos = torch.arange(s, device=x.device)
        q = rotate(dense.q(x).view(b, s, case.heads, d).transpose(1, 2), pos, dense.theta)
        k = rotate(dense.k(x).view(b, s, case.kv_heads, d).transpose(1, 2), pos, dense.theta)
        k = k.repeat_interleave(case.heads // case.kv_heads, dim=1)
        s_max = float((q @ k.transpose(-1, -2)).abs().max()) / math.sqrt(d)
    return y.detach(), xd.grad.detach(), grads, s_max


def run_case(impl_spec: str, case_dict: dict) -> dict:
    """Rank side. Returns {"refused", "unsupported", "problems", "worst", "bound"}."""
    from harness.records import registry
    from reference.context_parallel import layout as layouts

    case = Case(**case_dict)
    cp, r, device = dist.get_world_size(), dist.get_rank(), rank_device()
    dense, x, g = _inputs(case, device)
    before = {n: p.detach().clone() for n, p in dense.named_parameters()}
    y, dx, grads, s_max = _one_device(dense, x, g, case)
    limit = bound(case, cp, s_max)
    impl = registry.load(impl_spec, "context_parallel")
    module, declined = attempt("shard", impl.shard, dense, dist.group.WORLD, case.layout, rank=r)
    if declined:
        return declined
    try:
        mine = layouts.chunks(case.seq, cp, r, case.layout)
    except ValueError as exc:  # the layout cannot split this sequence: the module must refuse it too
        mine = None
        why = str(exc)
    x_local = layouts.shard(x, cp, r, case.layout) if mine else x[:, : case.seq // cp].clone()
    x_local.requires_grad_()
    y_local, declined = attempt("forward", module, x_local, rank=r)
    if declined:
        return declined
    if mine is None:  # accepted a sequence the layout cannot split: a silently short rank
        return checked([f"rank {r}: accepted a sequence of {case.seq} tokens that {why[:-1].lower()}"], math.inf,
                       limit)
    try:
        (y_local * layouts.shard(g, cp, r, case.layout)).sum().backward()
        full = impl.full_grads(module, dist.group.WORLD)
    except Exception as exc:  # noqa: BLE001
        return failed_here(f"rank {r}: backward / full_grads raised {describe(exc)}")
    checks = [("output", y_local, layouts.shard(y, cp, r, case.layout)),
              ("input gradient", x_local.grad, layouts.shard(dx, cp, r, case.layout))]
    checks += [(f"gradient {n}", full.get(n), grads[n]) for n in grads]
    worst, problems = compared(checks, limit, r)
    problems += [f"rank {r}: {n}: not a parameter of the dense attention" for n in sorted(set(full) - set(grads))]
    problems += [f"rank {r}: shard modified the dense module's {n}" for n, p in dense.named_parameters()
                 if not torch.equal(p.detach(), before[n])]
    return checked(problems, worst, limit, s_max=s_max)


def count_bytes(impl_spec: str, case_dict: dict) -> dict:
    """Rank side: {"forward", "backward"} bytes this rank sends in one forward and one backward of the
    implementation (``harness.runtime.comm_count.counted_traffic``)."""
    from harness.records import registry
    from harness.runtime.comm_count import counted_traffic
    from reference.context_parallel import layout as layouts

    case = Case(**case_dict)
    cp, r = dist.get_world_size(), dist.get_rank()
    dense, x, g = _inputs(case, rank_device())
    impl = registry.load(impl_spec, "context_parallel")
    module = impl.shard(dense, dist.group.WORLD, case.layout)
    x_local = layouts.shard(x, cp, r, case.layout).requires_grad_()
    forward, backward = [0.0], [0.0]
    with counted_traffic(forward):
        y = module(x_local)
    with counted_traffic(backward):
        (y * layouts.shard(g, cp, r, case.layout)).sum().backward()
    return {"forward": forward[0], "backward": backward[0]}


def as_dict(case: Case) -> dict:
    return asdict(case)
