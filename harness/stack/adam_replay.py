"""Adam's step replayed from a stack's own state (rank side): how the low-precision seam holds Adam's masters and
second moment, which the precision-matched bound cannot.

The bound (``harness.stack.precision.allowed_ratio``) is derived for rounding errors of sums — the gradients — and
holds a tensor by its largest element. Adam's first moment is linear in the gradients (each step's is (m_k - b1
m_{k-1}) / (1 - b1)), so it stays held by the bound. Its update and second moment are not: lr m / (sqrt(v) + eps)
turns a gradient's error into lr x error / eps where |g| is near 0 and damps it elsewhere, and g^2 weighs the
largest |g|; a tensor's E_T then rests on one or two elements, and a run rounding its per-token values elsewhere (TP's
partial sums, another stack's kernels) sits many E_T off by chance, no less exact (measured: the reference stack at
tp 2, Llama bf16, Adam eps 1e-3: 4 of 12 seeds beyond 6.3 E_T, up to 12.3, all in masters and second moments — its
first moments, the gradients, 2.2 - 4.0). So those two are held by what they are, Adam applied to the stack's own
state: per step k and element, with g the gradient the stack's first moment took,

    v_k = b2 v_{k-1} + (1 - b2) g^2,    p_k = d p_{k-1} - lr / (1 - b1^k) * m_k / (sqrt(v_k / (1 - b2^k)) + eps)

(torch's Adam, d = 1; AdamW's d = 1 - lr x weight_decay for a parameter its rule decays; p_0 the loaded weights, m_0 =
v_0 = 0) — within the rounding of fp32 arithmetic, per element (``tol_v``,
``tol_p``). A wrong second moment (a local gradient's, a stale one), an update off the recipe or a master not kept in
fp32 fails here; a wrong gradient fails the first moment's bound."""

from __future__ import annotations

import torch

EPS32 = torch.finfo(torch.float32).eps
"""The spacing of fp32 at 1: every fp32 operation of the stack's step rounds within EPS32 / 2 of its result."""


def gradient(m, m_prev, beta1: float):
    """The gradient Adam's first moment took at this step (float64), and how far it may be from the stack's fp32 one:
    m_k = m_{k-1} + (1 - b1)(g - m_{k-1}) (torch's lerp; b1 m_{k-1} + (1 - b1) g alike) rounds three times, each
    within EPS32 / 2 of |m_k| + |m_{k-1}| — within 2 EPS32 of it with margin —, which recovering g divides by 1 - b1;
    1 - b1 itself rounded to fp32 adds EPS32 |g|."""
    g = (m - beta1 * m_prev) / (1 - beta1)
    return g, EPS32 * (2 * (m.abs() + m_prev.abs()) / (1 - beta1) + g.abs())


def tol_v(v, v_prev, g, slack, beta2: float):
    """|v_k - replay| allowed: the stack's three roundings (b2 v_{k-1}, (1 - b2) g^2, their sum: within 2 EPS32 of
    |v_k| + |v_{k-1}|, b2 and 1 - b2 in fp32 included) and (1 - b2)((|g| + slack)^2 - g^2), the gradient recovered
    from m being within ``slack`` of the stack's."""
    return 2 * EPS32 * (v.abs() + v_prev.abs()) + (1 - beta2) * slack * (2 * g.abs() + slack)


def tol_p(p, update, decayed=None):
    """|p_k - replay| allowed: the stack's update rounds five times (sqrt, two divisions, the eps sum, the product:
    within 5 EPS32 / 2 of it), its sum with p_{k-1} once (within EPS32 / 2 of |p_k|); twice that, for the step size
    and the bias corrections cast to fp32 and the order of the operations. AdamW's decay (``decayed``: d p_{k-1}, one
    more product) rounds once more, within EPS32 / 2 of it: its own term, doubled likewise."""
    return EPS32 * (p.abs() + 5 * update.abs() + (decayed.abs() if decayed is not None else 0))


def problems(spec, k: int, prev: dict, state: dict, names: list[str], ties: dict[str, str],
             lr: float | None = None) -> list[str]:
    """One line per tensor whose master or second moment is not Adam's step of the stack's own state. ``k``: the
    step (1-based); ``prev`` / ``state``: {"params": {name: tensor}, "optimizer": {"name/key": tensor}} before and
    after it (float64; ``prev`` at k = 1: the loaded weights and no state); ``names``: the parameters (each once);
    ``ties``: {name: the parameter it is} — the stack's tensor under it must be that parameter's, bitwise; ``lr``: the
    step's learning rate (a schedule's; None: the spec's)."""
    b1, b2 = spec.betas
    lr = spec.lr if lr is None else lr
    out = [f"master {n}: not {o}, which it is tied to" for n, o in sorted(ties.items())
           if n in state["params"] and o in state["params"] and not torch.equal(state["params"][n], state["params"][o])]
    for name in sorted(names):
        p, p_prev = state["params"].get(name), prev["params"].get(name)
        m, v = (state["optimizer"].get(f"{name}/{key}") for key in ("exp_avg", "exp_avg_sq"))
        if p is None or m is None or v is None or p_prev is None:
            out.append(f"master {name}: missing from the dense state, or its Adam state (exp_avg, exp_avg_sq)")
            continue
        if not p.shape == p_prev.shape == m.shape == v.shape:
            out.append(f"master {name}: shape {tuple(p.shape)}, its Adam state's {tuple(m.shape)} and "
                       f"{tuple(v.shape)}, the parameter's {tuple(p_prev.shape)}")
            continue
        zero = torch.zeros_like(p)
        m_prev = prev["optimizer"].get(f"{name}/exp_avg", zero)
        v_prev = prev["optimizer"].get(f"{name}/exp_avg_sq", zero)
        g, slack = gradient(m, m_prev, b1)
        want_v = b2 * v_prev + (1 - b2) * g * g
        off_v = _over((v - want_v).abs(), tol_v(v, v_prev, g, slack, b2))
        denom = (v / (1 - b2 ** k)).sqrt() + spec.eps
        update = lr / (1 - b1 ** k) * m / denom
        decayed = p_prev * (1 - lr * spec.weight_decay) if spec.decays(p.shape) else None
        want_p = (p_prev if decayed is None else decayed) - update
        off_p = _over((p - want_p).abs(), tol_p(p, update, decayed))
        for what, off, got, want in (("second moment", off_v, v, want_v), ("master", off_p, p, want_p)):
            worst = float(off.max()) if off.numel() else 0.0
            if not worst <= 1.0:
                i = int(off.flatten().argmax())
                out.append(f"{what} {name}: not Adam's step {k} of the stack's own state — element {i} "
                           f"{float(got.flatten()[i]):.9g}, the step gives {float(want.flatten()[i]):.9g} "
                           f"({worst:.3g} x fp32's rounding of it)")
    return out


def _over(diff, tol):
    """diff / tol per element, 0 where both are (an element nothing moved); NaN where the stack's is."""
    return torch.where(diff == 0, torch.zeros_like(diff), diff / tol)
