"""The Muon case: a small model's parameters (an embedding, a fused QKV or separate q / k / v, the attention output,
a fused gate + up or separate ones, the down projection, a norm, the LM head, and a matrix of 10 rows — uneven over
4 ranks), three optimizer steps from the same gradients on every rank, held to one device (``reference.muon``).

The bound: the implementation and one device run the same bfloat16 Newton-Schulz, rounded in other places where a
sharded matmul's partial sums are reduced over the ranks — by the triangle inequality within E_T + |got - exact|,
E_T one device's distance from exact arithmetic (the iteration in float64) per tensor, and as for the stacks'
precision-matched bound (``harness.stack.precision.allowed_ratio``: 1 + 2 sqrt(m k + dp + 2 tp), here m = k = 1,
dp = 1 and tp = the ranks that split a matmul) — 1 + 2 sqrt(2 + 2n) E_T: 5.5 at 2 ranks, 7.3 at 4. The reference
gathers each whole matrix and runs the very same arithmetic: it is held bitwise besides (the suite asserts 0). A
Newton-Schulz on a rank's rows, a fused matrix orthogonalised whole, or AdamW for a matrix is off by O(1) of the
update: 30-80 E_T measured (the planted bugs; torch's Muon on DTensors: 3.2-4.3 E_T)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from harness.errors import describe
from harness.stack.precision import allowed_ratio
from harness.verdict import attempt, checked, failed, failed_here  # noqa: F401 - failed: the suites' verdict

H, V = 8, 11


@dataclass(frozen=True)
class Case:
    layout: str = "rows"
    world: int = 2
    fused: bool = True
    steps: int = 3
    seed: int = 0
    adjust_lr_fn: str | None = None
    nesterov: bool = True
    hidden: int = H
    """The model's width (the suite's 8; the bench's larger): QKV 2h x h, gate + up 3h x h, down h x 3h / 2."""

    def label(self) -> str:
        return (f"{self.layout}-n{self.world}-{'fused' if self.fused else 'split'}"
                + (f"-{self.adjust_lr_fn}" if self.adjust_lr_fn else "") + ("" if self.nesterov else "-plain"))

    def spec(self):
        from reference.muon import MuonSpec

        h, f = self.hidden, 3 * self.hidden // 2
        parts = {"blocks.0.attn.qkv.weight": (h, h // 2, h // 2), "blocks.0.mlp.gate_up.weight": (f, f)}
        return MuonSpec(parts=parts if self.fused else {}, adjust_lr_fn=self.adjust_lr_fn, nesterov=self.nesterov)


def shapes(case: Case) -> dict:
    h, f = case.hidden, 3 * case.hidden // 2
    attn = ({"blocks.0.attn.qkv.weight": (2 * h, h)} if case.fused else
            {"blocks.0.attn.q.weight": (h, h), "blocks.0.attn.k.weight": (h // 2, h),
             "blocks.0.attn.v.weight": (h // 2, h)})
    mlp = ({"blocks.0.mlp.gate_up.weight": (2 * f, h)} if case.fused else
           {"blocks.0.mlp.gate.weight": (f, h), "blocks.0.mlp.up.weight": (f, h)})
    return {"embed.weight": (V, h), **attn, "blocks.0.attn.o.weight": (h, h), **mlp,
            "blocks.0.mlp.down.weight": (h, f), "blocks.0.norm.weight": (h,), "blocks.0.extra.weight": (10, 6),
            "head.weight": (V, h)}


def inputs(case: Case) -> tuple[dict, list]:
    """(parameters, the gradients of each step): float32, from the seed, the same on every rank. The fused parts
    have scales 1, 4 and 1/4 — orthogonalised whole, the large part would dominate the small."""
    gen = torch.Generator().manual_seed(case.seed)
    params = {k: torch.randn(*s, generator=gen) for k, s in shapes(case).items()}
    grads = []
    for _ in range(case.steps):
        step = {k: torch.randn(*s, generator=gen) for k, s in shapes(case).items()}
        for k, scale in (("qkv", (1.0, 4.0, 0.25)), ("gate_up", (1.0, 4.0))):
            name = f"blocks.0.{'attn' if k == 'qkv' else 'mlp'}.{k}.weight"
            if name in step:
                rows = case.spec().part_rows(name, step[name].shape[0])
                step[name] = torch.cat([p * s for p, s in zip(step[name].split(rows), scale, strict=True)])
        grads.append(step)
    return params, grads


def run_case(impl_spec: str, case_dict: dict) -> dict:
    """Rank side: {"refused", "unsupported", "problems", "worst", "bound", "bitwise"}."""
    from harness.records import registry
    from reference.muon import local_part, one_device

    case = Case(**case_dict)
    r, n = dist.get_rank(), dist.get_world_size()
    if n != case.world:
        return failed(f"rank {r}: the case needs {case.world} ranks, the World has {n}")
    params, grads = inputs(case)
    spec = case.spec()
    want = one_device(params, grads, spec)
    exact = one_device({k: v.double() for k, v in params.items()}, grads, spec, dtype=torch.float64)
    impl = registry.load(impl_spec, "muon")
    opt, declined = attempt("shard", impl.shard, {k: v.clone() for k, v in params.items()}, spec, case.layout,
                            dist.group.WORLD, rank=r, bitwise=False)
    if declined:
        return declined
    ratio, worst, problems, bitwise = allowed_ratio(1, 1, 1, n), 0.0, [], True
    for step in range(case.steps):
        try:
            impl.step(opt, local_part(grads[step], case.layout, r, n))
            got = impl.full(opt)
        except Exception as exc:  # noqa: BLE001 - the implementation's failure is a verdict
            return failed_here(f"rank {r}: step {step + 1} raised {describe(exc)}", bitwise=False)
        for k in shapes(case):
            w, e_t = want[step][k], float((want[step][k].double() - exact[step][k]).abs().max())
            g = got.get(k)
            if g is None or tuple(g.shape) != tuple(w.shape):
                problems.append(f"rank {r}: step {step + 1}: {k}: {'missing' if g is None else tuple(g.shape)}")
                continue
            off = float((g.detach().double() - w.double()).abs().max())
            bitwise = bitwise and torch.equal(g.detach().to(w.dtype), w)
            units = off / e_t if e_t > 0 else (0.0 if off == 0 else math.inf)
            worst = max(worst, units)
            if not off <= ratio * e_t or not math.isfinite(off):
                problems.append(f"rank {r}: step {step + 1}: {k}: off by {off:.3g} = {units:.3g} E_T > {ratio:.3g} "
                                f"E_T (E_T {e_t:.3g})")
        if problems:
            break
    return checked(sorted(set(problems)), worst, ratio, bitwise=bitwise)


def as_dict(case: Case) -> dict:
    return asdict(case)
