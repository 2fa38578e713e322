"""The ``megatron`` tensor-parallel implementation: megatron-core's ``tensor_parallel`` layers on CPU/gloo
(``initialize_model_parallel`` with the whole world as the TP group, ``use_cpu_initialization=True``).
The dense weights are copied into Megatron's shards (its even split), so results compare exactly."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..contracts import Unsupported


class _OutputOnly(nn.Module):
    """Megatron's parallel linears return (output, bias-if-skipped); the contract wants the output."""

    def __init__(self, layer, kind: str):
        super().__init__()
        self.layer, self.kind = layer, kind

    def forward(self, x):
        return self.layer(x)[0]


def _config(n: int, dtype, sequence_parallel: bool):
    from megatron.core import parallel_state
    from megatron.core.model_parallel_config import ModelParallelConfig

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=n)
    return ModelParallelConfig(tensor_model_parallel_size=n, sequence_parallel=sequence_parallel,
                               use_cpu_initialization=True, perform_initialization=False, params_dtype=dtype)


def _no_init(weight):
    return weight


class MegatronTensorParallel:
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

        def column(lin: nn.Linear):
            if lin.out_features % n:
                raise ValueError(f"out_features ({lin.out_features}) must divide by the tensor-parallel size ({n}) "
                                 "for megatron-core.")
            layer = tensor_parallel.ColumnParallelLinear(
                lin.in_features, lin.out_features, config=_config(n, lin.weight.dtype, sequence_parallel),
                init_method=_no_init, bias=lin.bias is not None, gather_output=False)
            block = slice(r * lin.out_features // n, (r + 1) * lin.out_features // n)
            with torch.no_grad():
                layer.weight.copy_(lin.weight[block])
                if lin.bias is not None:
                    layer.bias.copy_(lin.bias[block])
            return _OutputOnly(layer, "column")

        def row(lin: nn.Linear):
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

        if kind == "column":
            return column(dense)
        if kind == "row":
            return row(dense)
        if kind == "mlp":
            fc1, act, fc2 = dense
            return nn.Sequential(column(fc1), act, row(fc2))
        raise Unsupported(f"kind {kind!r} is not one of column, row, mlp.")

    def full_grads(self, kind, sharded, group=None) -> dict:
        from reference.tensor_parallel.adapter import full_linear_grads

        if kind == "mlp":
            return {f"0.{k}": v for k, v in self.full_grads("column", sharded[0], group).items()} | \
                {f"2.{k}": v for k, v in self.full_grads("row", sharded[2], group).items()}
        layer = sharded.layer
        # Megatron marks parameters replicated over a sequence-parallel region; it all-reduces their
        # gradients later, in its optimizer step.
        partial = getattr(layer.bias, "sequence_parallel", False)
        return full_linear_grads(kind, layer.weight, layer.bias, group, partial_bias=partial)
