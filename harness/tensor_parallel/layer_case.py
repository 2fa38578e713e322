"""The reference tensor-parallel layer cases (rank side): build dense, shard with from_dense, compare.

Integer weights and inputs keep every matmul partial sum exact (|sums| far below 2^24), so forward
outputs, input gradients and weight-gradient shards must equal the dense layer's bit for bit.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from reference.tensor_parallel import (
    ColumnParallelLinear,
    ParallelMLP,
    RowParallelLinear,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)

EPS64 = 2.0**-53


def _ints(shape, seed: int, lo: int = -2, hi: int = 2, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, shape, generator=g).to(dtype)


def _dense_linear(in_f: int, out_f: int, seed: int, dtype) -> torch.nn.Linear:
    lin = torch.nn.Linear(in_f, out_f, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(_ints((out_f, in_f), seed))
        lin.bias.copy_(_ints((out_f,), seed + 1))
    return lin


def _mismatch(name: str, got: torch.Tensor, want: torch.Tensor, tol: float | torch.Tensor = 0.0) -> list[str]:
    if got.shape != want.shape:
        return [f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"]
    bad = ~((got - want).abs() <= tol)  # NaN counts as a difference
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        return [f"{name}: {int(bad.sum())} of {got.numel()} differ, first got {got.flatten()[i].item()!r} "
                f"expected {want.flatten()[i].item()!r}"]
    return []


def linear_pair(kind: str, seq: int, batch: int, in_f: int, out_f: int, seed: int, dtype: str, flag: bool,
                sequence_parallel: bool) -> list[str]:
    """One Column (flag = gather_output) or Row (flag = input_is_parallel) layer vs its dense twin."""
    n, r = dist.get_world_size(), dist.get_rank()
    dt = getattr(torch, dtype)
    dense = _dense_linear(in_f, out_f, seed, dt)
    x_full = _ints((seq, batch, in_f), seed + 2, -3, 3, dt).requires_grad_()
    up_full = _ints((seq, batch, out_f), seed + 3, -2, 2, dt)
    (dense(x_full) * up_full).sum().backward()
    want_y = dense(x_full).detach()
    seq_part = slice(r * seq // n, (r + 1) * seq // n) if sequence_parallel else slice(None)
    if kind == "column":
        layer = ColumnParallelLinear.from_dense(dense, None, gather_output=flag, sequence_parallel=sequence_parallel)
        cols = slice(layer.offset, layer.offset + layer.out_per_rank)
        x = x_full.detach()[seq_part].clone().requires_grad_()
        y = layer(x)
        want_local = want_y if flag else want_y[..., cols]
        up = up_full if flag else up_full[..., cols]
        (y * up).sum().backward()
        return (_mismatch("output", y.detach(), want_local) + _mismatch("input grad", x.grad, x_full.grad[seq_part])
                + _mismatch("weight grad", layer.weight.grad, dense.weight.grad[cols])
                + _mismatch("bias grad", layer.bias.grad, dense.bias.grad[cols]))
    layer = RowParallelLinear.from_dense(dense, None, input_is_parallel=flag, sequence_parallel=sequence_parallel)
    cols = slice(layer.offset, layer.offset + layer.in_per_rank)
    x = (x_full.detach()[..., cols] if flag else x_full.detach()).clone().requires_grad_()
    y = layer(x)
    (y * up_full[seq_part]).sum().backward()
    want_x_grad = x_full.grad[..., cols] if flag else x_full.grad
    bias_grad = layer.bias.grad.clone()
    if sequence_parallel:  # each rank saw its sequence slice only: the group sum is the full gradient
        dist.all_reduce(bias_grad)
    return (_mismatch("output", y.detach(), want_y[seq_part]) + _mismatch("input grad", x.grad, want_x_grad)
            + _mismatch("weight grad", layer.weight.grad, dense.weight.grad[:, cols])
            + _mismatch("bias grad", bias_grad, dense.bias.grad))


def mlp(seq: int, batch: int, hidden: int, ffn: int, seed: int, sequence_parallel: bool) -> list[str]:
    """ParallelMLP (GeLU) vs dense in float64. fc1 is exact (integers); GeLU is elementwise on the same
    bits; fc2 sums its ffn products in two levels (per rank, then across ranks) instead of one, so each
    output differs by at most (ffn + n) eps times the sum of the absolute products: the bound used."""
    n, r = dist.get_world_size(), dist.get_rank()
    fc1, fc2 = _dense_linear(hidden, ffn, seed, torch.float64), _dense_linear(ffn, hidden, seed + 5, torch.float64)
    x_full = _ints((seq, batch, hidden), seed + 2, -3, 3)
    h = F.gelu(fc1(x_full)).detach()
    want = fc2(h).detach()
    bound = (ffn + n) * EPS64 * (h.abs() @ fc2.weight.abs().T + fc2.bias.abs())
    part = slice(r * seq // n, (r + 1) * seq // n) if sequence_parallel else slice(None)
    layer = ParallelMLP.from_dense(fc1, fc2, None, sequence_parallel=sequence_parallel)
    return _mismatch("mlp output", layer(x_full[part]).detach(), want[part], bound[part])


def embedding(vocab: int, dim: int, tokens: int, seed: int) -> list[str]:
    """VocabParallelEmbedding (padded when vocab does not divide) vs nn.Embedding: lookups, exact."""
    dense = torch.nn.Embedding(vocab, dim, dtype=torch.float64)
    with torch.no_grad():
        dense.weight.copy_(_ints((vocab, dim), seed))
    ids = torch.randint(0, vocab, (tokens,), generator=torch.Generator().manual_seed(seed + 1))
    layer = VocabParallelEmbedding.from_dense(dense, None)
    up = _ints((tokens, dim), seed + 2)
    out = layer(ids)
    (out * up).sum().backward()
    (dense(ids) * up).sum().backward()
    rows = slice(layer.start, layer.end)
    problems = _mismatch("embedding", out.detach(), dense(ids).detach())
    problems += _mismatch("weight grad", layer.weight.grad[: layer.end - layer.start], dense.weight.grad[rows])
    if layer.end - layer.start < layer.rows_per_rank and bool(layer.weight.grad[layer.end - layer.start:].any()):
        problems.append("padding rows received gradient")
    return problems


def cross_entropy(tokens: int, vocab: int, seed: int, padded: bool = False) -> list[str]:
    """vocab_parallel_cross_entropy vs F.cross_entropy in float64. Both are log(sum exp(z - max)) -
    (z_t - max); the sums of V positive terms differ in order (two levels here), each within V eps
    relative, so the logs differ by at most 2 V eps; each side rounds the log and the final difference
    of two non-negative terms no larger than |loss|: 4 eps |loss|. The gradient softmax - onehot differs
    by 2 V eps: the bounds used. ``padded``: about a third of the targets are the ignore index (-100), whose
    loss and gradient must be exactly 0, as F.cross_entropy's."""
    n, r = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(tokens, vocab, generator=g, dtype=torch.float64) * 3).requires_grad_()
    target = torch.randint(0, vocab, (tokens,), generator=g)
    if padded:
        target = target.masked_fill(torch.rand(tokens, generator=g) < 1 / 3, -100)
    want = F.cross_entropy(logits, target, reduction="none", ignore_index=-100)
    want.sum().backward()
    per = -(-vocab // n)
    shard = torch.zeros(tokens, per, dtype=torch.float64)
    lo, hi = r * per, min((r + 1) * per, vocab)
    shard[:, : max(0, hi - lo)] = logits.detach()[:, lo:hi]
    shard.requires_grad_()
    got = vocab_parallel_cross_entropy(shard, target, vocab, None)
    got.sum().backward()
    problems = _mismatch("loss", got.detach(), want.detach(), 2 * vocab * EPS64 + 4 * EPS64 * want.detach().abs())
    problems += _mismatch("logit grad", shard.grad[:, : max(0, hi - lo)], logits.grad[:, lo:hi], 2 * vocab * EPS64)
    if hi - lo < per and bool(shard.grad[:, max(0, hi - lo):].any()):
        problems.append("padding columns received gradient")
    ignored = target == -100
    if bool(got.detach()[ignored].any()) or bool(shard.grad[ignored].any()):
        problems.append("an ignored target (-100) has a loss or a gradient")
    return problems


def bad_shape(out_features: int) -> str:
    try:
        ColumnParallelLinear(4, out_features)
    except ValueError as exc:
        return str(exc)
    return "no error"


class _ForgetsBackwardAllReduce(ColumnParallelLinear):
    """Planted bug: the input goes in without copy_to_region, so its gradient is never all-reduced."""

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


def planted_column(seq: int, in_f: int, out_f: int) -> list[str]:
    dense = _dense_linear(in_f, out_f, 7, torch.float64)
    x_full = _ints((seq, 1, in_f), 9, -3, 3).requires_grad_()
    up = _ints((seq, 1, out_f), 10)
    (dense(x_full) * up).sum().backward()
    layer = _ForgetsBackwardAllReduce.from_dense(dense, None)
    cols = slice(layer.offset, layer.offset + layer.out_per_rank)
    x = x_full.detach().clone().requires_grad_()
    (layer(x) * up[..., cols]).sum().backward()
    return _mismatch("output", layer(x).detach(), dense(x_full).detach()[..., cols]) + \
        _mismatch("input grad", x.grad, x_full.grad)


def _block(total: int, n: int, r: int) -> slice:
    """Rank r's block of ``total`` as torch.chunk splits it (equal blocks when n divides)."""
    sizes = [len(c) for c in torch.arange(total).chunk(n)] + [0] * n
    start = sum(sizes[:r])
    return slice(start, start + sizes[r])


def attention(seq: int, batch: int, heads_per_rank: int, head_dim: int, seed: int,
              sequence_parallel: bool) -> list[str]:
    """ParallelAttention vs DenseAttention in float64 (random weights). Each rank's heads are computed
    by the same ops as the dense layer's; only o's sum over heads is regrouped (per rank, then across
    ranks), so outputs differ by at most (hidden + n) eps times the sum of the absolute products; the
    gradients, through softmax, by (seq * batch + hidden + n) eps relative to their magnitude, times a
    depth factor 8 for the four projections and the softmax chain."""
    from reference.tensor_parallel import DenseAttention, ParallelAttention

    n, r = dist.get_world_size(), dist.get_rank()
    hidden = n * heads_per_rank * head_dim
    torch.manual_seed(seed)
    dense = DenseAttention(hidden, n * heads_per_rank, dtype=torch.float64)
    rows = slice(r * seq // n, (r + 1) * seq // n) if sequence_parallel else slice(None)
    layer = ParallelAttention.from_dense(dense, None, sequence_parallel=sequence_parallel)
    problems, g_tol = attention_against_dense(dense, layer, seq, batch, rows, n, seed)
    cols = slice(layer.q.offset, layer.q.offset + layer.q.out_per_rank)
    for name in ("q", "k", "v"):
        want = getattr(dense, name).weight.grad[cols]
        problems += _mismatch(f"{name} weight grad", getattr(layer, name).weight.grad, want,
                              g_tol * float(want.abs().max() + 1))
    want_o = dense.o.weight.grad[:, cols]
    problems += _mismatch("o weight grad", layer.o.weight.grad, want_o, g_tol * float(want_o.abs().max() + 1))
    return problems


def attention_against_dense(dense, sharded, seq: int, batch: int, rows: slice, n: int, seed: int):
    """Forward and backward of ``sharded`` (this rank's ``rows`` of the sequence) and of ``dense`` on the same
    random input and upstream gradient (float64): (output and input-gradient problems, the relative
    gradient tolerance). The bounds are derived in ``attention``; the dense layer keeps its gradients."""
    hidden = dense.q.in_features
    x_full = torch.randn(seq, batch, hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    x_full.requires_grad_()
    up = torch.randn(seq, batch, hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    want = dense(x_full)
    (want * up).sum().backward()
    core = _attend_dense(dense, x_full.detach())
    bound = (hidden + n) * EPS64 * (core.abs() @ dense.o.weight.abs().T + dense.o.bias.abs()) * 4
    x = x_full.detach()[rows].clone().requires_grad_()
    y = sharded(x)
    (y * up[rows]).sum().backward()
    g_tol = 8 * (seq * batch + hidden + n) * EPS64
    problems = _mismatch("output", y.detach(), want.detach()[rows], bound[rows])
    problems += _mismatch("input grad", x.grad, x_full.grad[rows], g_tol * float(x_full.grad.abs().max() + 1))
    return problems, g_tol


def _attend_dense(dense, x):
    from reference.tensor_parallel.layers import _attend

    with torch.no_grad():
        return _attend(dense.q(x), dense.k(x), dense.v(x), dense.heads)


def train_block(impl_spec: str, seq: int, batch: int, hidden: int, ffn: int, seed: int, steps: int) -> dict:
    """A Linear-GELU-Linear block trained ``steps`` SGD-with-momentum steps (sum loss), sharded through
    the contract vs dense, on the same batch. Returns per-step losses of both and the largest output
    difference on a probe input after training, with the bound it must stay within:
    each step's output differs by at most the MLP bound b = (ffn + n) eps sum|products| (see ``mlp``);
    gradients inherit at most (seq * batch) times that relative error, and with lr * |grad| << |weight|
    the trained weights differ by at most steps * (2 lr) of it; we allow 8 (steps + 1) b."""
    from harness.records import registry

    n = dist.get_world_size()
    impl = registry.load(impl_spec, "tensor_parallel")
    dense = torch.nn.Sequential(_dense_linear(hidden, ffn, seed, torch.float64), torch.nn.GELU(),
                                _dense_linear(ffn, hidden, seed + 5, torch.float64))
    try:
        sharded = impl.shard("mlp", dense, None, False)
    except NotImplementedError as exc:
        return {"unsupported": str(exc)}
    x = _ints((seq, batch, hidden), seed + 2, -3, 3)
    target = _ints((seq, batch, hidden), seed + 3)
    lr, momentum = 2.0**-14, 0.5
    losses = {"dense": [], "sharded": []}
    for name, module in (("dense", dense), ("sharded", sharded)):
        opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=momentum)
        for _ in range(steps):
            opt.zero_grad()
            loss = ((module(x) - target) ** 2).sum()
            loss.backward()
            opt.step()
            losses[name].append(float(loss))
    probe = _ints((seq, batch, hidden), seed + 4, -3, 3)
    with torch.no_grad():
        h = F.gelu(dense[0](probe))
        bound = (ffn + n) * EPS64 * float((h.abs() @ dense[2].weight.abs().T + dense[2].bias.abs()).max())
        diff = float((sharded(probe) - dense(probe)).abs().max())
    return {"losses": losses, "diff": diff, "bound": 8 * (steps + 1) * bound}
