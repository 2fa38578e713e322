"""The tensor-parallel contract conformance case (inputs, oracle, check; rank side): one layer of one
implementation, sharded through the contract, against the dense layer in float64. ``dims`` by kind:

  column / row / mlp: (seq, batch, in_features, out_features)    (mlp: hidden, ffn)
  embedding:          (seq, batch, vocab, dim)
  lm_head:            (seq, batch, hidden, vocab)
  attention:          (seq, batch, heads, head_dim)

Integer weights and inputs keep column, row and embedding exact: compared bitwise. mlp, lm_head and
attention go through GELU / softmax: each bound is derived where it is used.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..verdict import attempt, checked, failed_here
from .layer_case import EPS64, _block, _dense_linear, _ints, _mismatch, attention_against_dense


def _dense(kind: str, dims: tuple, seed: int) -> torch.nn.Module:
    seq, batch, a, b = dims
    if kind == "mlp":
        return torch.nn.Sequential(_dense_linear(a, b, seed, torch.float64), torch.nn.GELU(),
                                   _dense_linear(b, a, seed + 5, torch.float64))
    if kind == "embedding":
        dense = torch.nn.Embedding(a, b, dtype=torch.float64)
        with torch.no_grad():
            dense.weight.copy_(_ints((a, b), seed))
        return dense
    if kind == "lm_head":
        dense = _dense_linear(a, b, seed, torch.float64)
        dense.bias = None
        return dense
    if kind == "attention":
        from reference.tensor_parallel import DenseAttention

        torch.manual_seed(seed)
        return DenseAttention(a * b, a, dtype=torch.float64)
    return _dense_linear(a, b, seed, torch.float64)


def contract_case(impl_spec: str, kind: str, dims: tuple, seed: int, sequence_parallel: bool) -> dict:
    from harness.errors import describe
    from harness.records import findings, registry

    n, r = dist.get_world_size(), dist.get_rank()
    impl = registry.load(impl_spec, "tensor_parallel")
    dense = _dense(kind, dims, seed)
    sharded, declined = attempt("shard", impl.shard, kind, dense, None, sequence_parallel,
                                case=_conditions(kind, dense, n))
    if declined:
        return declined
    rows = _block(dims[0], n, r) if sequence_parallel else slice(None)
    check = {"embedding": _embedding, "lm_head": _lm_head, "attention": _attention}.get(kind, _linear)
    conditions = _conditions(kind, dense, n)
    # A loss computed in lower precision is held to that precision's rounding only where the suite's
    # findings registry records it for this (built-in) implementation: precision-matched bounds.
    precision = findings.precision(impl_spec, "tensor_parallel", **conditions)
    eps = torch.finfo(getattr(torch, precision or "float64")).eps / 2
    try:
        problems, dense_grads, tol = check(kind, dims, seed, dense, sharded, rows, n, r, eps)
    except Exception as exc:  # noqa: BLE001 - the sharded module's forward or backward raised
        return _failure(f"the sharded module's forward or backward raised {describe(exc)}", kind, dense, n)
    try:
        grads = impl.full_grads(kind, sharded, None)
    except Exception as exc:  # noqa: BLE001
        return _failure(f"full_grads raised {describe(exc)}", kind, dense, n)
    if not isinstance(grads, dict):
        return _failure(f"full_grads returned {type(grads).__name__}, not a dict of full gradients", kind, dense, n)
    for name, g in dense_grads.items():
        got = grads.get(name)
        problems += (_mismatch(f"{name} grad", got, g, tol(g)) if torch.is_tensor(got)
                     else [f"{name} grad: missing from full_grads (got {type(got).__name__})"])
    problems += [f"full_grads has a key the dense layer does not: {k!r}" for k in grads if k not in dense_grads]
    return checked(problems, case=conditions)


def _failure(detail: str, kind: str, dense, n: int) -> dict:
    """The code under test raised (not ValueError at shard time, not Unsupported) or returned no usable
    result: a failure with its detail (peers still inside the code under test are ended after the World's
    grace)."""
    return failed_here(detail, case=_conditions(kind, dense, n))


def _conditions(kind: str, dense, n: int) -> dict:
    """The case's parameters that findings' conditions read (harness/records/findings.py)."""
    row = {"row": dense, "mlp": dense[-1] if kind == "mlp" else None, "attention": getattr(dense, "o", None)}.get(kind)
    vocab = {"lm_head": getattr(dense, "out_features", 0),
             "embedding": getattr(dense, "num_embeddings", 0)}.get(kind, 0)
    return {"kind": kind, "n": n, "row_bias": row is not None and row.bias is not None, "vocab_remainder": vocab % n}


def _exact(g):
    return 0.0


def _linear(kind, dims, seed, dense, sharded, rows, n, r, eps):
    """column / row exact; mlp: fc2 sums its ffn products in two levels instead of one, so outputs differ
    by at most (ffn + n) eps times the sum of the absolute products (x4 for GELU's own rounding);
    gradients regroup sums over (seq x batch) and the fc2 shards: (seq * batch + ffn + n) eps relative to
    their magnitude, x8 for the chain through GELU's derivative."""
    seq, batch, in_f, out_f = dims
    width_out = in_f if kind == "mlp" else out_f
    x_full = _ints((seq, batch, in_f), seed + 2, -3, 3).requires_grad_()
    up_full = _ints((seq, batch, width_out), seed + 3)
    want_y = dense(x_full)
    (want_y * up_full).sum().backward()
    feat_in = _block(in_f, n, r) if kind == "row" else slice(None)
    x = (x_full.detach()[..., feat_in] if kind == "row" else x_full.detach()[rows]).clone().requires_grad_()
    y = sharded(x)
    if kind == "column":
        want_local, up = want_y.detach()[..., _block(out_f, n, r)], up_full[..., _block(out_f, n, r)]
    else:
        want_local, up = want_y.detach()[rows], up_full[rows]
    (y * up).sum().backward()
    want_x_grad = x_full.grad[..., feat_in] if kind == "row" else x_full.grad[rows]
    if kind != "mlp":
        return (_mismatch("output", y.detach(), want_local) + _mismatch("input grad", x.grad, want_x_grad),
                {name: p.grad for name, p in dense.named_parameters()}, _exact)
    fc1, _, fc2 = dense
    h = F.gelu(fc1(x_full.detach())).detach()
    tol = (out_f + n) * EPS64 * (h.abs() @ fc2.weight.abs().T + fc2.bias.abs())[rows] * 4
    g_tol = (seq * batch + out_f + n) * EPS64 * 8
    problems = _mismatch("output", y.detach(), want_local, tol)
    problems += _mismatch("input grad", x.grad, want_x_grad, g_tol * float(want_x_grad.abs().max() + 1))
    return (problems, {name: p.grad for name, p in dense.named_parameters()},
            lambda g: g_tol * float(g.abs().max() + 1))


def _embedding(kind, dims, seed, dense, sharded, rows, n, r, eps):
    """Lookups of integer rows, summed with zeros from the other ranks: exact, as is the weight gradient
    (integer upstream gradients)."""
    seq, batch, vocab, dim = dims
    ids = torch.randint(0, vocab, (seq, batch), generator=torch.Generator().manual_seed(seed + 1))
    up = _ints((seq, batch, dim), seed + 2)
    want = dense(ids)
    (want * up).sum().backward()
    y = sharded(ids)
    (y * up[rows]).sum().backward()
    return _mismatch("output", y.detach(), want.detach()[rows]), {"weight": dense.weight.grad}, _exact


def _lm_head(kind, dims, seed, dense, sharded, rows, n, r, eps):
    """Logits are integer-exact; the cross-entropy log(sum exp(z - max)) - (z_t - max) sums V positive
    terms in another order (two levels): each side's sum is within V eps relative, so the logs differ by
    at most 2 V eps; each side rounds the log and the final difference of two non-negative terms, both
    at most |loss|: 4 eps |loss| more (a 1-ulp difference at loss 20 was seen). Each logit gradient
    softmax - onehot (|.| <= 1) differs by (2 V + 4) eps (the sum, the exponential and the division).
    With |upstream| <= 2 and |x| <= 3 over T tokens the weight gradient sum_t up_t g_t x_t differs by
    at most 2 * 3 * T ((2 V + 4) + T) eps; the input gradient up_t sum_v g_tv W_v by
    2 ((2 V + 4) + V + n) eps sum_v |W_v| (two-level sum over V).
    ``eps`` is the unit roundoff of the dtype the loss is computed in (float64 unless the findings registry
    records a lower precision for this implementation; integer logits |z| <= 3 * 2 * hidden are exact in either); the
    products and sums outside the loss are float64: their terms keep EPS64."""
    seq, batch, hidden, vocab = dims
    tokens = seq * batch
    x_full = _ints((seq, batch, hidden), seed + 2, -3, 3).requires_grad_()
    target = torch.randint(0, vocab, (seq, batch), generator=torch.Generator().manual_seed(seed + 1))
    up = _ints((seq, batch), seed + 3)
    want = F.cross_entropy(dense(x_full).flatten(0, 1), target.flatten(), reduction="none").view(seq, batch)
    (want * up).sum().backward()
    x = x_full.detach()[rows].clone().requires_grad_()
    loss = sharded(x, target)
    (loss * up).sum().backward()
    g_v = (2 * vocab + 4) * eps
    x_tol = 2 * (g_v + (vocab + n) * EPS64) * dense.weight.abs().sum(0)
    problems = _mismatch("loss", loss.detach(), want.detach(), 2 * vocab * eps + 4 * eps * want.detach().abs())
    problems += _mismatch("input grad", x.grad, x_full.grad[rows], x_tol)
    return problems, {"weight": dense.weight.grad}, lambda g: 6 * tokens * (g_v + tokens * EPS64)


def _attention(kind, dims, seed, dense, sharded, rows, n, r, eps):
    """Random float64 weights. Each rank's heads run the same ops as the dense layer's; only o's sum over
    heads regroups (per rank, then across ranks): outputs within (hidden + n) eps times the sum of the
    absolute products (x4 for the core's rounding); gradients, through softmax, within
    (seq * batch + hidden + n) eps relative to their magnitude, x8 for the four projections and the
    softmax chain."""
    problems, g_tol = attention_against_dense(dense, sharded, dims[0], dims[1], rows, n, seed)
    return (problems, {name: p.grad for name, p in dense.named_parameters()},
            lambda g: g_tol * float(g.abs().max() + 1))
