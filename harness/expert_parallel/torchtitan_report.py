"""Rank side of torchtitan's MoE against one device (``harness.adapters.torchtitan.moe`` says what it defines).

torchtitan's experts compute in bfloat16 whatever the weights' dtype, so no float32 or float64 bound can hold
them. Precision-matched, as the mixed-precision suites hold a bf16 run: three runs of the same batch —
  exact:    our one-device layer in float64 (reference.models.moe, no load-balancing loss: torchtitan has none);
  single:   torchtitan's own layer on one device (unparallelized: its local token dispatcher), float32 weights;
  parallel: torchtitan's layer under its expert parallelism over the World.
For every part (each rank's output rows and input gradient, the router's, every expert's and the shared
expert's gradient) E_T = max |single - exact| is the recipe's own error; the parallel run must be within
``allowed_ratio`` x E_T of single (``harness.stack.precision.allowed_ratio`` with dp = n: each expert's and the
router's gradient is a sum of up to n per-rank partials, each rounded as one device rounds its one GEMM), plus
float32's regrouping bound (``case.bound`` in float32 units) for the parts bf16 does not touch. So that a wrong
single run cannot widen its own bound, single is held to exact too: within RECIPE_U bf16 unit roundoffs of
each tensor's largest magnitude."""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.runtime.rank import rank_device

from ..stack.precision import allowed_ratio
from .case import U64, Case, _dense, _inputs, bound, received_here

U_BF16 = 2.0**-9
RECIPE_U = {"output": 18, "gradient": 36}
"""The forward chain rounds 9 times to bf16 (tokens, w1, w3, both GEMMs' outputs, silu, the product, w2, the
output), each within u of the magnitudes it touches; x 2 for cancellation against the tensor's largest
magnitude: 18 u. The backward runs the chain again through the same roundings: 36 u."""


def torchtitan_moe_report(case_dict: dict) -> dict:
    """{"parts": {part: (|parallel - single| / E_T, E_T / magnitude)}, "problems", "ratio", "received"}."""
    from harness.adapters.torchtitan.moe import OneDevice, TorchtitanMoE, titan_grads

    case = Case(**case_dict)
    n, r, device = dist.get_world_size(), dist.get_rank(), rank_device()
    dense = _dense(case, n, device)
    x, g = _inputs(case, n, dense, device)
    rows = slice(r * case.tokens, (r + 1) * case.tokens)

    xe = x.clone().requires_grad_()
    ye = dense(xe)[0]
    (ye * g).sum().backward()
    exact = {"output": ye.detach()[rows], "input gradient": xe.grad[rows]}
    exact.update({f"gradient {k}": p.grad.detach() if p.grad is not None else torch.zeros_like(p)
                  for k, p in dense.named_parameters()})
    dense.zero_grad(set_to_none=True)

    one = OneDevice(dense)
    x1 = x.float().clone().requires_grad_()
    y1, _ = one(x1)
    (y1 * g.float()).sum().backward()
    single = {"output": y1.detach()[rows], "input gradient": x1.grad[rows]}
    single.update({f"gradient {k}": v for k, v in titan_grads(one.moe).items()})

    impl = TorchtitanMoE()
    module = impl.shard(dense, dist.group.WORLD, case.ep)
    xp = x[rows].float().clone().requires_grad_()
    yp, aux = module(xp)
    ((yp * g[rows].float()).sum() + aux).backward()
    parallel = {"output": yp.detach(), "input gradient": xp.grad}
    parallel.update({f"gradient {k}": v for k, v in impl.full_grads(module, dist.group.WORLD).items()})

    ratio = allowed_ratio(1, 1, n, 1)
    regroup = bound(case, n) * 2.0**-24 / U64
    parts, problems = {}, []
    for what, want in exact.items():
        got, mine = parallel.get(what), single.get(what)
        if got is None or mine is None:
            problems.append(f"rank {r}: {what}: missing from {'the parallel run' if got is None else 'one device'}")
            continue
        scale = float(want.abs().max()) or 1.0
        e_t = float((mine.double() - want).abs().max())
        diff = float((got.double() - mine.double()).abs().max())
        parts[what] = (diff / max(e_t, 1e-300), e_t / scale)
        recipe = RECIPE_U["output" if what == "output" else "gradient"] * U_BF16
        if not e_t <= recipe * scale:  # NaN fails
            problems.append(f"rank {r}: {what}: torchtitan on one device is off by {e_t / scale:.3g} of its magnitude "
                            f"> {recipe:.3g} (its bf16 recipe's bound)")
        if not diff <= ratio * e_t + regroup * scale:
            problems.append(f"rank {r}: {what}: off by {diff:.3g} = {diff / max(e_t, 1e-300):.3g} E_T > {ratio:.3g} "
                            f"E_T (E_T = {e_t:.3g}) from torchtitan on one device")
    return {"parts": parts, "problems": problems, "ratio": ratio, "aux": float(aux.detach()),
            "received": received_here(case, dense, x, module, n, r)}
