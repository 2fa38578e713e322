"""The low-precision conformance case (inputs, oracle, check; rank side): one linear layer trained two steps under a
float8 / MX recipe over a layout of dp x tp ranks, every call held to one device running the same recipe.

Inputs (the same on every rank, float32): a global batch X (dp m tokens, K), the weight W (N, K) and the upstream
gradient G (dp m tokens, N), each a normal draw times a geometric ramp from 1 to 2^20 along every dimension, the two
operands of each GEMM ramping opposite ways along its reduction dimension (X up and W down along K, G up and W down
along N, G down and X up along the tokens), so every term of every sum counts. So any shard of any dimension has an
amax far from the whole tensor's — and far enough to matter to a power-of-two scale: rounding to nearest commutes
with a power of two, so rowwise and MX scales from the wrong amax change nothing but the range; at 2^20 the lower
shard of two lies 2^10 to 2^20 below the amax, across the edge of e4m3's normal range (2^-14.8 of the amax). A local
amax is visibly wrong, never lucky.
Call c (DP rank c // m, microbatch c % m) is X's and G's rows [c tokens, (c + 1) tokens).

Oracle, per step from the weight the implementation holds (``full_weight``): one device runs every call under the
recipe (``reference.low_precision.one_device``: float64, no rounding after the casts). Check, each call: this rank's
part of y and of dx; each step: the whole dW summed over the calls; the weight the next step starts from is this
step's minus lr dW (the implementation's ``sgd_step``).

Bound (``bound``). With the same casts — the same amaxes, so the same scales — the operands are bit-identical to one
device's, and the results differ only in how their sums are rounded: a scaled GEMM accumulates in fp32 over its
reduction length L (K, N or the call's tokens), the layout adds partial sums (tp partial outputs, m microbatches, dp
replicas) and rounds once to fp32. Higham's bound for a sum of n terms in any order, |fl(s) - s| <= n u sum |terms|,
gives each element within (L + tp + m dp + 2) u32 of its magnitude — the same GEMM of the operands' absolute values
(``one_device``'s "|y|", ...). A cast from another amax moves an operand by up to half a float8 step (2^-4 of it for
e4m3): 10^4 times further out."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from ..errors import describe
from ..verdict import attempt, checked, failed, failed_here  # noqa: F401 - failed: run_or_fail's verdict of a failed call

U32 = 2.0**-24
"""float32's unit roundoff: the accumulation of a scaled GEMM."""
RAMP = 20.0
"""log2 of every dimension's ramp."""


@dataclass(frozen=True)
class Case:
    recipe: str = "float8-tensorwise"
    kind: str = "column"
    sp: bool = False
    fp8_all_gather: bool = False
    dp: int = 1
    tp: int = 2
    tokens: int = 32
    k: int = 64
    n: int = 64
    microbatches: int = 1
    steps: int = 2
    seed: int = 0

    @property
    def world(self) -> int:
        return self.dp * self.tp

    def layout(self):
        from reference.low_precision import Layout

        return Layout(self.kind, self.sp, self.fp8_all_gather)

    def label(self) -> str:
        return (f"{self.recipe}-{self.layout().label()}-dp{self.dp}tp{self.tp}-t{self.tokens}k{self.k}n{self.n}"
                + (f"-m{self.microbatches}" if self.microbatches > 1 else ""))

    def finding_keys(self) -> dict:
        """The case's parameters the findings' conditions read (the suite's and the bench's)."""
        return {"fp8_all_gather": self.fp8_all_gather, "rows_remainder": self.n % self.dp, "kind": self.kind,
                "recipe": self.recipe}


def bound(case: Case) -> float:
    """The largest allowed |difference| / magnitude of any element (the module docstring)."""
    return (max(case.k, case.n, case.tokens) + case.tp + case.microbatches * case.dp + 2) * U32


def _ramp(length: int) -> torch.Tensor:
    return torch.exp2(torch.linspace(0.0, RAMP, length))


def learning_rate(w: torch.Tensor, dw: torch.Tensor) -> float:
    """The suite's SGD step, from one device's first step: the power of two (lr dW exact) that moves the largest
    gradient's element by 2 to 4 times the weight's amax — where the ramps put it, the weight is small: the amax
    moves by 2x or more, and a scale kept from the last step is wrong."""
    return float(2.0 ** math.ceil(math.log2(2 * float(w.abs().max()) / max(float(dw.abs().max()), 1e-300))))


def inputs(case: Case):
    """(X, W, G), float32, from the case's seed."""
    gen = torch.Generator().manual_seed(case.seed)
    rows = case.dp * case.microbatches * case.tokens
    t, k, n = _ramp(case.tokens).repeat(case.dp * case.microbatches), _ramp(case.k), _ramp(case.n)
    x = torch.randn(rows, case.k, generator=gen) * t[:, None] * k[None, :]
    w = torch.randn(case.n, case.k, generator=gen) * n.flip(0)[:, None] * k.flip(0)[None, :]
    g = torch.randn(rows, case.n, generator=gen) * t.flip(0)[:, None] * n[None, :]
    return x.float(), w.float(), g.float()


def groups(dp: int, tp: int):
    """(this rank's TP group, its DP group): rank r is TP rank r % tp of DP rank r // tp (made collectively)."""
    r, tp_group, dp_group = dist.get_rank(), None, None
    for d in range(dp):
        g = dist.new_group([d * tp + t for t in range(tp)])
        tp_group = g if r // tp == d else tp_group
    for t in range(tp):
        g = dist.new_group([d * tp + t for d in range(dp)])
        dp_group = g if r % tp == t else dp_group
    return tp_group, dp_group


def off_elementwise(what: str, got, want: torch.Tensor, magnitude: torch.Tensor, limit: float, r: int):
    """(worst |got - want| / magnitude, problem lines) of one tensor."""
    if got is None:
        return math.inf, [f"rank {r}: {what}: missing"]
    got = got.detach().double()
    if got.shape != want.shape:
        return math.inf, [f"rank {r}: {what}: shape {tuple(got.shape)}, one device's {tuple(want.shape)}"]
    if not torch.isfinite(got).all():
        return math.inf, [f"rank {r}: {what}: {int((~torch.isfinite(got)).sum())} element(s) not finite"]
    diff = (got - want).abs()
    rel = torch.where(magnitude > 0, diff / magnitude.clamp(min=1e-300), diff * math.inf)
    rel = torch.nan_to_num(rel, nan=0.0)
    worst = float(rel.max()) if rel.numel() else 0.0
    if worst <= limit:
        return worst, []
    at = divmod(int(rel.argmax()), want.shape[-1]) if want.dim() == 2 else int(rel.argmax())
    i = rel.argmax()
    return worst, [f"rank {r}: {what}: {worst / U32:.3g} u32 of its magnitude at {at} (bound {limit / U32:.3g}): "
                   f"{float(got.reshape(-1)[i]):.6g} vs one device's {float(want.reshape(-1)[i]):.6g}"]


def _forward_bytes(module, x) -> tuple:
    """(y, the bytes this rank sent during the forward)."""
    from harness.runtime.comm_count import counted_traffic

    sent = [0.0]
    with counted_traffic(sent):
        y = module(x)
    return y, sent[0]


def run_case(impl_spec: str, case_dict: dict) -> dict:
    """Rank side. Returns {"refused", "unsupported", "problems", "worst", "bound", "amax_moved",
    "gather_bytes_per_element"}."""
    from harness.records import registry
    from reference.low_precision import local_part, one_device, recipe

    case = Case(**case_dict)
    r, limit = dist.get_rank(), bound(case)
    if dist.get_world_size() != case.world:
        return failed(f"rank {r}: the case needs {case.world} ranks, the World has {dist.get_world_size()}")
    tp_group, dp_group = groups(case.dp, case.tp)
    t_rank, d_rank, layout, rec = r % case.tp, r // case.tp, case.layout(), recipe(case.recipe)
    x_all, w0, g_all = inputs(case)
    impl = registry.load(impl_spec, "low_precision")
    extra = {"amax_moved": False, "gather_bytes_per_element": None}
    module, declined = attempt("shard", impl.shard, w0.clone(), case.recipe, layout, tp_group, dp_group, rank=r,
                               **extra)
    if declined:
        return declined
    worst, problems, amaxes, w_next, lr = 0.0, [], [], None, None
    tokens = case.tokens
    for step in range(case.steps):
        w_now, declined = attempt("full_weight", impl.full_weight, module, tp_group, dp_group, rank=r, **extra)
        if declined:
            return declined
        w_now = w_now.detach().float()
        amaxes.append(float(w_now.abs().max()))
        if w_next is not None:  # the weight this step starts from: the last one's minus lr dW
            rel, lines = off_elementwise(f"step {step}: weight", w_now, w_next[0], w_next[1], 2 * U32, r)
            worst, problems = max(worst, rel), problems + lines
        oracle = [one_device(x_all[c * tokens:(c + 1) * tokens], w_now, g_all[c * tokens:(c + 1) * tokens], rec)
                  for c in range(case.dp * case.microbatches)]
        for p in module.parameters():
            p.grad = None
        for i in range(case.microbatches):
            c = d_rank * case.microbatches + i
            x = local_part(x_all[c * tokens:(c + 1) * tokens], "x", layout, case.tp, t_rank).clone().requires_grad_()
            g = local_part(g_all[c * tokens:(c + 1) * tokens], "g", layout, case.tp, t_rank)
            try:
                y, sent = _forward_bytes(module, x)
                y.backward(g.to(y.dtype))
            except (ValueError, NotImplementedError) as exc:  # the forward's own refusal (an SP split that fails)
                return attempt("forward", _raise, exc, rank=r, **extra)[1]
            except Exception as exc:  # noqa: BLE001
                return failed_here(f"rank {r}: step {step}, call {c}: forward / backward raised {describe(exc)}",
                                   **extra)
            if layout.fp8_all_gather and step == 0 and i == 0:
                extra["gather_bytes_per_element"] = sent * case.dp / max(case.dp - 1, 1) / (case.n * case.k)
            o = oracle[c]
            for what, got, key in (("output", y, "y"), ("input gradient", x.grad, "dx")):
                rel, lines = off_elementwise(f"step {step}, call {c}: {what}", got,
                                             local_part(o[key], key, layout, case.tp, t_rank),
                                             local_part(o["|" + key + "|"], key, layout, case.tp, t_rank), limit, r)
                worst, problems = max(worst, rel), problems + lines
        dw, declined = attempt("full_grad", impl.full_grad, module, tp_group, dp_group, rank=r, **extra)
        if declined:
            return declined
        want, magnitude = sum(o["dw"] for o in oracle), sum(o["|dw|"] for o in oracle)
        lr = learning_rate(w_now, want) if lr is None else lr
        rel, lines = off_elementwise(f"step {step}: weight gradient", dw, want, magnitude, limit, r)
        worst, problems = max(worst, rel), problems + lines
        if dw is None or lines:
            break
        dw = dw.detach().double()
        w_next = (w_now.double() - lr * dw, w_now.double().abs() + lr * dw.abs())
        _, declined = attempt("sgd_step", impl.sgd_step, module, lr, tp_group, dp_group, rank=r, **extra)
        if declined:
            return declined
    if extra["gather_bytes_per_element"] is not None and extra["gather_bytes_per_element"] > 1.25:
        problems.append(f"rank {r}: the float8 all-gather was asked, but the forward sent "
                        f"{extra['gather_bytes_per_element']:.3g} bytes per weight element (float8: 1)")
    extra["amax_moved"] = len(set(amaxes)) > 1
    return checked(sorted(set(problems)), worst, limit, **extra)


def _raise(exc):
    raise exc


def count_bytes(impl_spec: str, case_dict: dict) -> dict:
    """Rank side: {"forward", "backward"} bytes this rank sends in the first call of the implementation."""
    from harness.records import registry
    from harness.runtime.comm_count import counted_traffic
    from reference.low_precision import local_part

    case = Case(**case_dict)
    tp_group, dp_group = groups(case.dp, case.tp)
    r = dist.get_rank()
    x_all, w, g_all = inputs(case)
    module = registry.load(impl_spec, "low_precision").shard(w, case.recipe, case.layout(), tp_group, dp_group)
    c = (r // case.tp) * case.microbatches
    x = local_part(x_all[c * case.tokens:(c + 1) * case.tokens], "x", case.layout(), case.tp, r % case.tp)
    g = local_part(g_all[c * case.tokens:(c + 1) * case.tokens], "g", case.layout(), case.tp, r % case.tp)
    forward, backward = [0.0], [0.0]
    with counted_traffic(forward):
        y = module(x.clone().requires_grad_())
    with counted_traffic(backward):
        y.backward(g.to(y.dtype))
    return {"forward": forward[0], "backward": backward[0]}


def as_dict(case: Case) -> dict:
    return asdict(case)
