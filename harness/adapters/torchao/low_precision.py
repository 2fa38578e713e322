"""torchao's float8 training through the low-precision contract: ``convert_to_float8_training`` with the recipe's
``Float8LinearConfig`` (``emulate=True``: its casts and its fp32 matmul of the dequantised operands, on any device),
parallelised as torchtitan does — TP with torchao's ``Float8ColwiseParallel`` / ``Float8RowwiseParallel`` (the
float8 all-gather of the activations) for tensorwise scaling and torch's ``ColwiseParallel`` / ``RowwiseParallel``
otherwise, FSDP2's ``fully_shard`` with ``enable_fsdp_float8_all_gather`` and, after every optimizer step,
``precompute_float8_dynamic_scale_for_fsdp`` (its documented use). DP replicas' gradients are all-reduced before the
step, as DDP would. MXFP8 is torchao's ``MXFP8Linear`` (the module torchtitan's MXFP8 converter builds; its GEMMs
through ``mx_mm``) with the emulated kernels and the recipe's FLOOR exponent rule (torchao's training default is
RCEIL: another recipe), its weight gradient in MXFP8 too (``wgrad_with_hp=False``)."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from harness.runtime.rank import rank_device
from reference.errors import Unsupported

_RECIPE_NAMES = {"float8-tensorwise": "tensorwise", "float8-rowwise": "rowwise"}
_MESHES: dict = {}
_FLOAT8_MOVES: dict = {}


def float8_collective_error(group) -> str | None:
    """None where ``group``'s backend all-gathers a float8 tensor, else the error it raises (probed once per backend,
    collectively: gloo has no float8 type — 'Invalid scalar type' — where nccl has)."""
    backend = dist.get_backend(group)
    if backend not in _FLOAT8_MOVES:
        from harness.errors import describe
        from harness.runtime.gloo_float8 import ORIGINAL

        n = dist.get_world_size(group)
        t = torch.zeros(2, dtype=torch.float8_e4m3fn, device=rank_device())
        try:  # torch's own function, not the byte-wise shim: what the backend itself moves
            ORIGINAL.get("all_gather_into_tensor", dist.all_gather_into_tensor)(t.new_empty(2 * n), t, group=group)
            _FLOAT8_MOVES[backend] = None
        except RuntimeError as exc:
            _FLOAT8_MOVES[backend] = describe(exc)
    return _FLOAT8_MOVES[backend]


def _mesh(dp: int, tp: int):
    from torch.distributed.device_mesh import init_device_mesh

    if (dp, tp) not in _MESHES:
        _MESHES[(dp, tp)] = init_device_mesh(rank_device().type, (dp, tp), mesh_dim_names=("dp", "tp"))
    return _MESHES[(dp, tp)]


def _local(t):
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _mean_to_sum(model) -> int:
    """FSDP2 reduce-scatters the mean over DP (its sum divided by dp: a PREMUL_SUM, which gloo lacks, would be needed
    to keep the sum); the contract's gradient is the sum: dp times it (exact for a power of two)."""
    return model.dp if model.layout.kind == "fsdp" else 1


class TorchaoLowPrecision:
    description = "torchao float8 training (emulated): Float8Linear under TP (DTensor) and FSDP2 (float8 all-gather)"

    def shard(self, weight, recipe: str, layout, tp_group, dp_group):
        from torch.distributed.tensor import Replicate, Shard

        config = self._config(recipe, layout)
        dp, tp = dist.get_world_size(dp_group), dist.get_world_size(tp_group)
        if recipe == "float8-tensorwise" and layout.sp and tp > 1 and (error := float8_collective_error(tp_group)):
            raise Unsupported(f"{dist.get_backend(tp_group)} cannot move float8 tensors ({error}), and torchao's "
                              f"float8 all-gather of the activations (DTensor's, issued from C++) does: it runs on "
                              f"nccl.")
        if layout.fp8_all_gather and float8_collective_error(dp_group):
            from harness.runtime import gloo_float8

            gloo_float8.install()  # FSDP2's all-gather of the float8 shards, as bytes (it computes nothing)
        n, k = weight.shape
        if recipe == "mxfp8" and layout.kind in ("column", "row"):
            from reference.low_precision import RECIPES, amax_groups

            # the contract's refusal (blocks of 32 a TP shard would split), said before torchao's DTensor raises
            # mid-forward ('Cannot unflatten unevenly sharded tensor')
            amax_groups(RECIPES[recipe], layout, tp_group, tp, (n, k))
        model = torch.nn.Sequential(self._linear(recipe, k, n))
        with torch.no_grad():
            model[0].weight.copy_(weight)
        self._convert(model, recipe, config)
        model.layout, model.dp_group, model.dp = layout, dp_group, dp
        if layout.kind in ("column", "row"):
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            if recipe == "float8-tensorwise":
                from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel as Col
                from torchao.float8.float8_tensor_parallel import Float8RowwiseParallel as Row
            else:
                Col, Row = ColwiseParallel, RowwiseParallel
            seq = Shard(0) if layout.sp else Replicate()
            plan = (Col(input_layouts=seq, output_layouts=Shard(-1)) if layout.kind == "column"
                    else Row(input_layouts=Shard(-1), output_layouts=seq))
            parallelize_module(model, _mesh(dp, tp)["tp"], {"0": plan})
        elif layout.kind == "fsdp":
            from torch.distributed.fsdp import fully_shard

            if tp > 1:
                raise Unsupported("this adapter shards FSDP over DP only (tp 1).")
            fully_shard(model, mesh=_mesh(dp, tp)["dp"])
            self._precompute(model)
        elif layout.kind != "replicated":
            raise Unsupported(f"no {layout.kind!r} layout in this adapter.")
        return model

    @staticmethod
    def _linear(recipe: str, k: int, n: int):
        return mxfp8_linear(k, n) if recipe == "mxfp8" else torch.nn.Linear(k, n, bias=False)

    @staticmethod
    def _convert(model, recipe: str, config):
        """Before TP / FSDP, as torchtitan converts (float8: torchao's module swap; MXFP8: built as MXFP8Linear)."""
        from torchao.float8 import convert_to_float8_training

        if recipe != "mxfp8":
            convert_to_float8_training(model, config=config)

    @staticmethod
    def _config(recipe: str, layout):
        """torchao's ``Float8LinearConfig`` for ``recipe`` (emulated), its float8 all-gather as the layout asks."""
        from torchao.float8 import Float8LinearConfig

        if recipe == "mxfp8":
            if layout.fp8_all_gather:  # asked and silently not done before: FSDP2 gathered the fp32 weights
                raise Unsupported("torchao's float8 all-gather is Float8LinearConfig's (enable_fsdp_float8_all_gather, "
                                  "tensorwise only); its MXFP8 training (MXFP8Linear) has none: FSDP2 all-gathers "
                                  "the weights in their own precision.")
            return None
        if recipe not in _RECIPE_NAMES:
            raise Unsupported(f"torchao's {recipe} training is not driven by this adapter (float8 tensorwise and "
                              f"rowwise, MXFP8 are).")
        try:
            return dataclasses.replace(Float8LinearConfig.from_recipe_name(_RECIPE_NAMES[recipe]), emulate=True,
                                       enable_fsdp_float8_all_gather=layout.fp8_all_gather)
        except AssertionError as exc:  # its own validation (0.18: the float8 all-gather is tensorwise only)
            raise Unsupported(f"torchao's Float8LinearConfig refuses {recipe} as asked: "
                              f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}.") from None

    @staticmethod
    def _precompute(model):
        if model.layout.fp8_all_gather:
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            precompute_float8_dynamic_scale_for_fsdp(model)

    def full_grad(self, module, tp_group, dp_group):
        grad = _local(module[0].weight.grad).detach().clone()
        if module.layout.kind != "fsdp" and module.dp > 1:
            dist.all_reduce(grad, group=dp_group)
        return grad * _mean_to_sum(module)

    def full_weight(self, module, tp_group, dp_group):
        return _local(module[0].weight.detach()).clone()

    def sgd_step(self, module, lr, tp_group, dp_group):
        w = module[0].weight
        if module.layout.kind != "fsdp" and module.dp > 1:
            local = w.grad.to_local() if hasattr(w.grad, "to_local") else w.grad
            dist.all_reduce(local, group=dp_group)
        with torch.no_grad():
            w.sub_(lr * _mean_to_sum(module) * w.grad)
        w.grad = None
        self._precompute(module)


class TorchaoMXFP8OpConfigFirst(TorchaoLowPrecision):
    """The finding's order: MXFP8 through ``quantize_(model, MXFP8TrainingOpConfig(...))`` on a plain ``nn.Linear``
    before TP — the order torchao's float8 conversion takes. DTensor then wraps torchao's weight wrapper, whose
    ``__torch_function__`` never sees the linear: the layer trains in fp32 (the watch runs it)."""

    description = "torchao MXFP8 by quantize_ before TP (the finding's order)"

    @staticmethod
    def _linear(recipe: str, k: int, n: int):
        return torch.nn.Linear(k, n, bias=False)

    @staticmethod
    def _convert(model, recipe: str, config):
        from torchao.quantization import quantize_

        quantize_(model, mxfp8_op_config())


def mxfp8_op_config():
    """torchao's op config for MXFP8 training (its weight wrapper) under the contract's recipe."""
    from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    return MXFP8TrainingOpConfig(kernel_preference=KernelPreference.EMULATED, wgrad_with_hp=False,
                                 scale_calculation_mode=ScaleCalculationMode.FLOOR)


def mxfp8_linear(k: int, n: int, bias: bool = False):
    """torchao's ``MXFP8Linear`` (what torchtitan's MXFP8 converter builds) for the contract's ``mxfp8`` recipe:
    emulated kernels (any device), e8m0 exponents by OCP MX's FLOOR rule, the weight gradient in MXFP8."""
    from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    return MXFP8Linear(k, n, bias=bias, kernel_preference=KernelPreference.EMULATED, wgrad_with_hp=False,
                       scale_calculation_mode=ScaleCalculationMode.FLOOR)


def float8_blocks(model, recipe: str):
    """``model``'s block linear layers under ``recipe`` (the stack contract's ``Recipe.low_precision``: the blocks'
    projections, not the LM head), in place — what a torch stack trains: torchao's emulated ``Float8Linear``
    (tensorwise, rowwise), or its ``MXFP8Linear`` (MXFP8; the weights and their names kept)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    if recipe == "mxfp8":
        for parent in list(model.blocks.modules()):
            for name, layer in list(parent.named_children()):
                if type(layer) is torch.nn.Linear:
                    mx = mxfp8_linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
                    mx.weight, mx.bias = layer.weight, layer.bias  # the same parameters, under the same names
                    setattr(parent, name, mx)
        return model
    if recipe not in _RECIPE_NAMES:
        raise Unsupported(f"torchao's {recipe} training is not driven here (float8 tensorwise and rowwise, MXFP8 "
                          f"are).")
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(_RECIPE_NAMES[recipe]), emulate=True)
    return convert_to_float8_training(model, config=config, module_filter_fn=lambda m, fqn: fqn.startswith("blocks."))
