"""The expert-parallel conformance case (inputs, oracle, check; rank side): the MoE feed-forward over the
World (EP groups of ``ep`` consecutive ranks), each rank given its own tokens, held to one device's layer on
every token.

Inputs: ``MoE`` from ``seed``; the global tokens x (n T, hidden) and an upstream gradient g, the same on every
rank; rank r takes rows [r T, (r + 1) T). **No top-k choice is tied**: x is redrawn (next seed) until every
token's gap between its k-th and (k+1)-th routing score is at least 1e-6 — 10^10 float64 ulps, more than any
regrouped sum moves a score, so every implementation selects the same experts. ``skew``: a feature of
every token set to 4 and the router's weights on it +3 for EP rank 0's experts and -3 for the rest — every
token routes to EP rank 0 (k <= E / ep): the other ranks receive zero tokens. Oracle: one device, y, aux =
dense(x) (``oracle``: with a capacity, the rule over each rank's tokens); loss = (y g).sum() + aux; backward.
Check: this rank's rows of y and of dx, the aux (every rank),
every ``full_grads`` tensor, within ``bound`` x the tensor's magnitude; the dense layer unchanged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from harness.runtime.rank import rank_device
from reference.models.moe import routing_gap, selection_bias

from ..errors import describe
from ..verdict import U64, attempt, checked, compared, failed_here
from ..verdict import failed as layer_failed


@dataclass(frozen=True)
class Case:
    hidden: int = 8
    ffn: int = 8
    experts: int = 4
    top_k: int = 2
    shared: int = 0
    scoring: str = "softmax"
    renormalize: bool = True
    tokens: int = 6
    """Per rank."""
    ep: int | None = None
    skew: bool = False
    seed: int = 0
    capacity_factor: float | None = None
    """The one-device layer's capacity rule, applied to each rank's own tokens (see ``oracle``)."""

    def label(self) -> str:
        return (f"E{self.experts}k{self.top_k}-ep{self.ep or 'n'}-T{self.tokens}-{self.scoring}"
                f"{'-shared' if self.shared else ''}{'-skew' if self.skew else ''}"
                f"{'-norenorm' if not self.renormalize else ''}"
                f"{f'-cap{self.capacity_factor:g}' if self.capacity_factor is not None else ''}")


def bound(case: Case, n: int) -> float:
    """Relative to each tensor's largest magnitude. The parallel layer computes the same terms as one device
    and regroups their sums: the router's and each expert's products (hidden and ffn terms), the softmax
    (E terms), the combine (k terms per token), the load-balancing loss's sums over the n T tokens and E
    experts, and the cross-rank reductions of the replicated parameters' gradients (n terms) — each within
    its term count x u of the magnitudes summed. x 4 stages chained (router, expert, combine, loss) x 2 for
    backward x 4 for cancellation: 32 x (hidden + ffn + E + k + n T + n) u."""
    return 32 * (case.hidden + case.ffn + case.experts + case.top_k + n * case.tokens + n) * U64


def _dense(case: Case, n: int, device):
    from reference.models.moe import MoE

    torch.manual_seed(case.seed)
    dense = MoE(case.hidden, case.ffn, case.experts, case.top_k, case.shared, case.scoring, case.renormalize,
                case.capacity_factor).to(device)
    ep = case.ep or n
    if case.skew:
        with torch.no_grad():
            owner = torch.arange(case.experts, device=device) // (case.experts // ep)
            dense.router.weight[:, 0] = torch.where(owner == 0, 3.0, -3.0).to(dense.router.weight.dtype)
    if case.scoring == "sigmoid":  # a selection bias that moves choices (``bias_moves``): zero would test nothing
        dense.bias.copy_(selection_bias(case.experts, torch.Generator().manual_seed(case.seed + 7)).to(device))
    return dense


def bias_moves(dense, x) -> int:
    """The tokens whose chosen experts the selection bias changes (0 for softmax scoring: it has none)."""
    if dense.scoring != "sigmoid":
        return 0
    with torch.no_grad():
        scores = torch.sigmoid(dense.router(x))
        plain = scores.topk(dense.top_k, dim=-1).indices.sort(-1).values
        biased = (scores + dense.bias).topk(dense.top_k, dim=-1).indices.sort(-1).values
    return int((plain != biased).any(-1).sum())


def _inputs(case: Case, n: int, dense, device):
    """(x, g): x redrawn until no token's k-th and (k+1)-th routing scores are within 1e-6."""
    for draw in range(1000):
        gen = torch.Generator().manual_seed(case.seed + 1 + draw)
        x = torch.randn(n * case.tokens, case.hidden, generator=gen, dtype=torch.float64).to(device)
        if case.skew:
            x[:, 0] = 4.0
        with torch.no_grad():
            gap = routing_gap(dense, x)  # inf where k = E: no choice to tie
        if gap >= 1e-6:
            g = torch.randn(n * case.tokens, case.hidden, generator=gen, dtype=torch.float64).to(device)
            return x, g
    raise AssertionError("no draw without a near-tie in 1000 attempts")


def run_case(impl_spec: str, case_dict: dict) -> dict:
    """Rank side. Returns {"refused", "unsupported", "problems", "worst", "bound", "received"}."""
    from harness.records import registry

    case = Case(**case_dict)
    n, r, device = dist.get_world_size(), dist.get_rank(), rank_device()
    dense = _dense(case, n, device)
    x, g = _inputs(case, n, dense, device)
    before = {k: v.detach().clone() for k, v in dense.state_dict().items()}
    xd = x.clone().requires_grad_()
    y, aux = oracle(dense, xd, n)
    ((y * g).sum() + aux).backward()
    grads = {k: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
             for k, p in dense.named_parameters()}
    dense.zero_grad(set_to_none=True)
    limit = bound(case, n)
    impl = registry.load(impl_spec, "expert_parallel")
    module, declined = attempt("shard", impl.shard, dense, dist.group.WORLD, case.ep, rank=r, received=None)
    if declined:
        return declined
    rows = slice(r * case.tokens, (r + 1) * case.tokens)
    x_local = x[rows].clone().requires_grad_()
    try:
        y_local, aux_local = module(x_local)
        ((y_local * g[rows]).sum() + aux_local).backward()
        full = impl.full_grads(module, dist.group.WORLD)
    except Exception as exc:  # noqa: BLE001
        return _failed(f"rank {r}: {describe(exc)}")
    checks = [("output", y_local, y[rows].detach()), ("input gradient", x_local.grad, xd.grad[rows]),
              ("load-balancing loss", aux_local.reshape(1), aux.detach().reshape(1))]
    checks += [(f"gradient {k}", full.get(k), grads[k]) for k in grads]
    worst, problems = compared(checks, limit, r)
    problems += [f"rank {r}: {k}: not a parameter of the dense layer" for k in sorted(set(full) - set(grads))]
    problems += [f"rank {r}: shard modified the dense layer's {k}" for k, v in dense.state_dict().items()
                 if not torch.equal(v, before[k])]
    received = received_here(case, dense, x, module, n, r) \
        if hasattr(module, "experts") and hasattr(module, "first") else None
    return checked(problems, worst, limit, received=received, bias_moves=bias_moves(dense, x),
                   dropped=dropped(dense, x, n))


def received_here(case: Case, dense, x, module, n: int, r: int) -> int:
    """The assignments of rank r's EP group that the one-device routing sends to this rank's experts
    (``module.first`` and the ``len(module.experts)`` after it): 0 where the skewed router starves it."""
    with torch.no_grad():
        chosen = dense.route(x)[1]
    mine = (chosen >= module.first) & (chosen < module.first + len(module.experts))
    ep = case.ep or n
    return int(mine[(r // ep) * ep * case.tokens:(r // ep + 1) * ep * case.tokens].sum())


def oracle(dense, x, n: int):
    """One device on the global tokens x (n T rows): (y, aux) = dense(x) — with a capacity factor, y block by
    block, the rule applied to each rank's T tokens as an expert-parallel layer applies it to the tokens each
    rank routes (DeepSpeed and Megatron size a capacity by the rank's tokens too), and aux over every token's
    choices (a dropped assignment still counts in f_i: it was chosen)."""
    from reference.models.moe import balance_loss

    if dense.capacity_factor is None:
        return dense(x)
    y = torch.cat([dense(block)[0] for block in x.chunk(n)])
    _, experts, balance = dense.route(x)
    return y, balance_loss(balance, experts, dense.num_experts)


def dropped(dense, x, n: int) -> int:
    """The assignments a capacity drops over the ranks' token blocks (0 when dropless)."""
    from reference.models.moe import kept_assignments

    if dense.capacity_factor is None:
        return 0
    with torch.no_grad():
        return sum(int((~kept_assignments(dense.route(b)[1], dense.num_experts, dense.capacity_factor)).sum())
                   for b in x.chunk(n))


def count_bytes(impl_spec: str, case_dict: dict) -> dict:
    """Rank side: {"forward", "backward", "counts", "ep_rank"}: the bytes this rank sends in one forward and
    one backward (``harness.runtime.comm_count.counted_traffic``) and the routing counts the layer reports."""
    from harness.records import registry
    from harness.runtime.comm_count import counted_traffic

    case = Case(**case_dict)
    n, r, device = dist.get_world_size(), dist.get_rank(), rank_device()
    dense = _dense(case, n, device)
    x, g = _inputs(case, n, dense, device)
    module = registry.load(impl_spec, "expert_parallel").shard(dense, dist.group.WORLD, case.ep)
    rows = slice(r * case.tokens, (r + 1) * case.tokens)
    x_local = x[rows].clone().requires_grad_()
    forward, backward = [0.0], [0.0]
    with counted_traffic(forward):
        y, aux = module(x_local)
    with counted_traffic(backward):
        ((y * g[rows]).sum() + aux).backward()
    return {"forward": forward[0], "backward": backward[0], "counts": module.last_counts, "ep_rank": module.ep_rank}


def _failed(detail: str) -> dict:
    return failed_here(detail, received=None)


def failed(detail: str) -> dict:
    """A rank's result where the implementation failed (``harness.runtime.world.run_or_fail``'s ``failed``)."""
    return layer_failed(detail, received=None)


def as_dict(case: Case) -> dict:
    return asdict(case)
