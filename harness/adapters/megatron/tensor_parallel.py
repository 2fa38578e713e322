"""The ``megatron`` tensor-parallel implementation: megatron-core's ``tensor_parallel`` layers on CPU/gloo
(``initialize_model_parallel`` with the whole world as the TP group, ``use_cpu_initialization=True``).
The dense weights are copied into Megatron's shards (its even split), so results compare exactly.

- embedding / lm_head: ``VocabParallelEmbedding`` / ``ColumnParallelLinear`` + ``vocab_parallel_cross_entropy``
  over the vocabulary padded to a multiple of the TP size, as Megatron's training pads it (zero rows).
- attention: Megatron's attention block is one fused q/k/v column-parallel linear and a row-parallel
  output projection around a per-rank attention core; here those are megatron-core's linears around the
  reference core (megatron's own ``SelfAttention`` needs a TransformerConfig and its own core and masks,
  a different layer from the dense one under test).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from harness.contracts import Unsupported


class _OutputOnly(nn.Module):
    """Megatron's parallel linears return (output, bias-if-skipped); the contract wants the output."""

    def __init__(self, layer, kind: str):
        super().__init__()
        self.layer, self.kind = layer, kind

    def forward(self, x):
        return self.layer(x)[0]


class _Head(nn.Module):
    def __init__(self, layer, vocab_size: int):
        super().__init__()
        self.layer, self.vocab_size = layer, vocab_size

    def forward(self, x, target):
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        return vocab_parallel_cross_entropy(self.layer(x)[0], target)


class _Attention(nn.Module):
    """Megatron's attention layout: one fused q/k/v ColumnParallelLinear (its ``linear_qkv``: this rank's q,
    k and v rows stacked, so the backward all-reduces the input gradient once), the rank's heads through
    the reference core, the output projection row-parallel."""

    def __init__(self, qkv, o, local_heads: int, causal: bool):
        super().__init__()
        self.qkv, self.o, self.local_heads, self.causal = qkv, o, local_heads, causal

    def forward(self, x):
        from reference.tensor_parallel.layers import _attend

        q, k, v = self.qkv(x)[0].chunk(3, dim=-1)
        return self.o(_attend(q, k, v, self.local_heads, self.causal))


def _config(n: int, dtype, sequence_parallel: bool):
    from megatron.core import parallel_state
    from megatron.core.model_parallel_config import ModelParallelConfig

    # the groups of this adapter: the world as the TP group (another user of megatron-core on this rank, the stack
    # or the MoE adapter, may have laid other ones)
    if not (parallel_state.model_parallel_is_initialized()
            and parallel_state.get_tensor_model_parallel_world_size() == n
            and parallel_state.get_pipeline_model_parallel_world_size() == 1
            and parallel_state.get_expert_model_parallel_world_size() == 1):
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=n)
    return ModelParallelConfig(tensor_model_parallel_size=n, sequence_parallel=sequence_parallel,
                               use_cpu_initialization=True, perform_initialization=False, params_dtype=dtype)


def _no_init(weight):
    return weight


def _padded(vocab: int, n: int) -> int:
    """Megatron's padded vocabulary (``_vocab_size_with_padding`` with make_vocab_size_divisible_by=1)."""
    return -(-vocab // n) * n


def _column(lin: nn.Linear, n: int, r: int, sequence_parallel: bool, rows: int | None = None):
    """megatron-core's ColumnParallelLinear holding rank ``r``'s rows of ``lin`` (``rows``: padded to that many)."""
    from megatron.core import tensor_parallel

    rows = rows or lin.out_features
    if rows % n:
        raise ValueError(f"out_features ({lin.out_features}) must divide by the tensor-parallel size ({n}) "
                         "for megatron-core.")
    layer = tensor_parallel.ColumnParallelLinear(
        lin.in_features, rows, config=_config(n, lin.weight.dtype, sequence_parallel), init_method=_no_init,
        bias=lin.bias is not None, gather_output=False)
    _copy_rows(layer.weight, lin.weight, r)
    if lin.bias is not None:
        _copy_rows(layer.bias, lin.bias, r)
    return layer


def _row(lin: nn.Linear, n: int, r: int, sequence_parallel: bool):
    """megatron-core's RowParallelLinear holding rank ``r``'s input columns of ``lin`` (its output whole)."""
    from megatron.core import tensor_parallel

    if lin.in_features % n:
        raise ValueError(f"in_features ({lin.in_features}) must divide by the tensor-parallel size ({n}) "
                         "for megatron-core.")
    layer = tensor_parallel.RowParallelLinear(
        lin.in_features, lin.out_features, config=_config(n, lin.weight.dtype, sequence_parallel),
        init_method=_no_init, bias=lin.bias is not None, input_is_parallel=True, skip_bias_add=False)
    block = slice(r * lin.in_features // n, (r + 1) * lin.in_features // n)
    with torch.no_grad():
        layer.weight.copy_(lin.weight[:, block])
        if lin.bias is not None:
            layer.bias.copy_(lin.bias)
    return _OutputOnly(layer, "row")


class MegatronTensorParallel:
    # Known non-conformances (float32 cross-entropy, softmax over the padded vocabulary) are the suite's
    # findings (harness/records/findings.py, suites/tensor_parallel/test_findings.py), not this adapter's to declare.

    def shard(self, kind, dense, group=None, sequence_parallel=False):
        from megatron.core import tensor_parallel

        if group not in (None, dist.group.WORLD):
            raise Unsupported("megatron-core uses its own global tensor-parallel group (the world here).")
        n, r = dist.get_world_size(), dist.get_rank()
        if sequence_parallel and n == 1:
            raise Unsupported("megatron-core refuses sequence parallelism without tensor parallelism (tp=1).")
        if sequence_parallel and not torch.cuda.is_available():
            # Its sequence-parallel mappings allocate on torch.cuda.current_device(): CUDA only.
            raise Unsupported("megatron-core's sequence-parallel mappings need CUDA (they allocate on "
                              "torch.cuda.current_device()).")

        def column(lin: nn.Linear, rows: int | None = None):
            return _column(lin, n, r, sequence_parallel, rows)

        def row(lin: nn.Linear):
            return _row(lin, n, r, sequence_parallel)

        def config(dtype):
            return _config(n, dtype, sequence_parallel)

        if kind == "column":
            return _OutputOnly(column(dense), "column")
        if kind == "row":
            return row(dense)
        if kind == "mlp":
            fc1, act, fc2 = dense
            return nn.Sequential(_OutputOnly(column(fc1), "column"), act, row(fc2))
        if kind == "embedding":
            layer = tensor_parallel.VocabParallelEmbedding(
                _padded(dense.num_embeddings, n), dense.embedding_dim, init_method=_no_init,
                config=config(dense.weight.dtype))
            _copy_rows(layer.weight, dense.weight, r)
            layer.vocab_size = dense.num_embeddings
            return layer
        if kind == "lm_head":
            return _Head(column(dense, _padded(dense.out_features, n)), dense.out_features)
        if kind == "attention":
            if dense.heads % n:
                raise ValueError(f"heads ({dense.heads}) must divide by the tensor-parallel size ({n}).")
            h = dense.q.out_features
            qkv = tensor_parallel.ColumnParallelLinear(h, 3 * h, config=config(dense.q.weight.dtype),
                                                       init_method=_no_init, bias=True, gather_output=False)
            block = slice(r * h // n, (r + 1) * h // n)
            with torch.no_grad():
                qkv.weight.copy_(torch.cat([lin.weight[block] for lin in (dense.q, dense.k, dense.v)]))
                qkv.bias.copy_(torch.cat([lin.bias[block] for lin in (dense.q, dense.k, dense.v)]))
            return _Attention(qkv, row(dense.o), dense.heads // n, getattr(dense, "causal", False))
        raise Unsupported(f"kind {kind!r} is not one of column, row, mlp, embedding, lm_head, attention.")

    def full_grads(self, kind, sharded, group=None) -> dict:
        from reference.tensor_parallel.adapter import _prefixed, full_linear_grads
        from reference.tensor_parallel.mappings import _gather_first

        if kind == "mlp":
            return _prefixed({"0": ("column", sharded[0]), "2": ("row", sharded[2])}, self, group)
        if kind == "attention":  # the fused q/k/v shard is [q rows; k rows; v rows] of this rank
            grads = {f"{name}.{what}": _gather_first(g.chunk(3)[i], group) for what, g in
                     (("weight", sharded.qkv.weight.grad), ("bias", sharded.qkv.bias.grad))
                     for i, name in enumerate("qkv")}
            return grads | {f"o.{k}": v for k, v in self.full_grads("row", sharded.o, group).items()}
        if kind in ("embedding", "lm_head"):
            weight = sharded.weight if kind == "embedding" else sharded.layer.weight
            return {"weight": _gather_first(weight.grad, group)[: sharded.vocab_size]}
        layer = sharded.layer
        # Megatron marks parameters replicated over a sequence-parallel region; it all-reduces their
        # gradients later, in its optimizer step.
        partial = getattr(layer.bias, "sequence_parallel", False)
        return full_linear_grads(kind, layer.weight, layer.bias, group, partial_bias=partial)


def _copy_rows(shard: torch.Tensor, full: torch.Tensor, rank: int) -> None:
    """Rank ``rank``'s block of rows of ``full`` (zero-padded to n blocks of len(shard)) into ``shard``."""
    with torch.no_grad():
        shard.zero_()
        rows = full[rank * len(shard):(rank + 1) * len(shard)]
        shard[: len(rows)].copy_(rows)
