"""megatron-core's mixture of experts (``MoELayer`` with the local spec: its ``TopKRouter``, its alltoall or
allgather token dispatcher over its expert-parallel group, ``SequentialMLP`` experts, shared experts) built
from the one-device layer's weights — on a CPU through ``megatron_cpu.on_cpu()`` (both dispatchers and the
router write CUDA into their code: a CUDA stream in the alltoall dispatcher's constructor, the router's weight
moved to the current CUDA device; the redirect's docstring lists all of it).

What megatron-core defines, read in its source (``transformer/moe/router.py``, ``moe_utils.py``, 0.16):
- the router computes in float32 whatever the parameters' dtype (its weight is created float32, its softmax
  runs with ``dtype=torch.float32``): the comparison runs in float32;
- softmax routing: ``moe_router_pre_softmax=False`` (its default) takes the top-k logits and their softmax —
  the contract's renormalised top-k; ``True`` the top-k of the softmax (``renormalize=False``);
- sigmoid routing (``moe_router_score_function="sigmoid"``, ``moe_router_enable_expert_bias``: DeepSeek-V3's):
  the top-k of sigmoid scores + its ``expert_bias`` buffer (loaded from the layer's selection bias), weighted
  by the chosen scores, renormalised (+ 1e-20) exactly when k > 1; its load-balancing loss reads the
  normalised sigmoid scores, as the contract's does, but counts f_i over the top-k of the scores **without**
  the bias (``compute_routing_scores_for_aux_loss``, as DeepSeek-V3's paper writes it), not over the experts
  the tokens went to (``harness.expert_parallel.third_party.megatron_aux``). Its bias update between steps
  (``moe_router_bias_update_rate``, in ``finalize_model_grads``) is a trainer's and is not run here;
- the load-balancing loss (``moe_router_load_balancing_type="aux_loss"``) is the Switch form E sum_i f_i P_i
  over **this rank's tokens** (reduced over tensor x context parallel ranks only, every top-k assignment
  counted: f_i = count_i / (T k)), attached to the router's output by ``MoEAuxLossAutoScaler`` (its gradient
  injected in backward, weight ``moe_aux_loss_coeff``); its value is what the layer logs (its aux-loss
  tracker) — the report holds the gradient one device gets from the sum of each rank's loss and the value
  each rank logs;
- dropless (no ``moe_expert_capacity_factor``); experts ``linear_fc1`` = [gate; up], ``linear_fc2`` = down.

Without TransformerEngine its router does not run at all: ``moe_utils`` imports ``te_general_gemm`` inside a
``try`` whose ``except ImportError`` defines nothing, and ``RouterGatingLinearFunction`` tests
``te_general_gemm is not None`` on every forward — a NameError (the finding, ``harness/records/findings.py``). The
adapter defines the name as None where the import failed, which is what that test expects.
The expert-data-parallel reduction is the caller's (Megatron's DDP marks expert parameters apart): full_grads
sums an expert over its expert-data-parallel group, the router over every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.adapters.megatron.cpu import on_cpu
from harness.contracts import Unsupported


class MegatronMoE:
    description = "megatron-core MoELayer (TopKRouter, alltoall / allgather dispatcher, SequentialMLP experts)"

    def __init__(self, dispatcher: str = "alltoall"):
        if dispatcher not in ("alltoall", "allgather"):
            raise ValueError(f"dispatcher must be alltoall or allgather; got {dispatcher!r}.")
        self.dispatcher = dispatcher

    def shard(self, dense, group, ep: int | None = None):
        if dense.scoring == "sigmoid" and dense.renormalize != (dense.top_k > 1):
            raise Unsupported("megatron-core's sigmoid router renormalises the chosen scores exactly when top-k > 1 "
                              f"(moe_utils.topk_routing_with_score_function): top-{dense.top_k} "
                              f"{'with' if dense.renormalize else 'without'} renormalisation is not what it computes.")
        if dense.scoring == "softmax" and dense.top_k == 1 and dense.renormalize:
            raise Unsupported("megatron-core routes top-1 only after the softmax (its own ValueError: 'use "
                              "--moe-router-pre-softmax when topk is 1'): a renormalised top-1 is not what it "
                              "computes.")
        if dense.capacity_factor is not None:
            raise Unsupported("the Megatron MoE adapter here runs dropless (no moe_expert_capacity_factor).")
        if group not in (None, dist.group.WORLD) and dist.get_world_size(group) != dist.get_world_size():
            raise Unsupported("megatron-core lays its expert-parallel groups over the whole world (parallel_state).")
        from megatron.core.transformer.moe import moe_utils

        if not moe_utils.HAVE_TE and not hasattr(moe_utils, "te_general_gemm"):  # the finding (module docstring)
            moe_utils.te_general_gemm = None
        with on_cpu():
            return _Layer(dense, ep or dist.get_world_size(), self.dispatcher)

    def full_grads(self, sharded, group) -> dict:
        return sharded.full_grads(group)

    @staticmethod
    def context():
        """Where a caller runs the layer's forward and backward: megatron-core's CPU redirect (a no-op on CUDA)."""
        return on_cpu()


class _Layer(torch.nn.Module):
    def __init__(self, dense, ep: int, dispatcher: str):
        from megatron.core import parallel_state as ps
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
        from megatron.core.transformer.moe.moe_layer import MoELayer
        from megatron.core.transformer.transformer_config import TransformerConfig

        super().__init__()
        E, hidden, ffn = dense.num_experts, dense.router.in_features, dense.experts[0].gate.out_features
        ps.destroy_model_parallel()
        ps.initialize_model_parallel(tensor_model_parallel_size=1, expert_model_parallel_size=ep)
        model_parallel_cuda_manual_seed(0)
        shared = dense.shared.gate.out_features if dense.shared is not None else None
        dtype = dense.router.weight.dtype
        config = TransformerConfig(
            num_layers=1, hidden_size=hidden, num_attention_heads=1, ffn_hidden_size=ffn, moe_ffn_hidden_size=ffn,
            num_moe_experts=E, moe_router_topk=dense.top_k, moe_token_dispatcher_type=dispatcher,
            moe_router_pre_softmax=not dense.renormalize and dense.scoring == "softmax",
            moe_router_score_function=dense.scoring, moe_router_enable_expert_bias=dense.scoring == "sigmoid",
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=1.0, moe_shared_expert_intermediate_size=shared,
            moe_router_dtype="fp64" if dtype == torch.float64 else None, expert_model_parallel_size=ep,
            use_cpu_initialization=True, params_dtype=dtype, add_bias_linear=False, gated_linear_unit=True,
            activation_func=torch.nn.functional.silu, bias_activation_fusion=False, moe_permute_fusion=False,
            hidden_dropout=0.0, attention_dropout=0.0)
        spec = moe_submodules(get_gpt_layer_local_spec(num_experts=E, moe_grouped_gemm=False))
        self.moe = MoELayer(config, spec, layer_number=1)
        self.moe.set_layer_number(1)  # what its TransformerLayer does: the router logs its loss under it
        self.ep_group, self.edp_group = ps.get_expert_model_parallel_group(), ps.get_expert_data_parallel_group()
        local = E // ep
        self.first = ps.get_expert_model_parallel_rank() * local
        with torch.no_grad():
            self.moe.router.weight.copy_(dense.router.weight)
            if self.moe.router.expert_bias is not None:  # its selection bias (float32, a buffer it updates)
                self.moe.router.expert_bias.copy_(dense.bias)
            for i, expert in enumerate(self.moe.experts.local_experts):
                _load_swiglu(expert, dense.experts[self.first + i])
            if shared is not None:
                _load_swiglu(self.moe.shared_experts, dense.shared)
        self.experts = list(self.moe.experts.local_experts)

    def forward(self, x):
        """(y (T, hidden), the load-balancing loss this rank logs, detached: its gradient is Megatron's, injected
        in backward)."""
        from megatron.core.transformer.moe.moe_utils import clear_aux_losses_tracker, get_moe_layer_wise_logging_tracker

        clear_aux_losses_tracker()
        y, _ = self.moe(x.unsqueeze(1))
        logged = get_moe_layer_wise_logging_tracker()["load_balancing_loss"]["values"]
        return y.squeeze(1), logged.sum().detach().to(x.dtype)

    def full_grads(self, group) -> dict:
        from reference.expert_parallel.moe import with_every_expert

        router = self.moe.router.weight
        g = router.grad.detach().clone() if router.grad is not None else torch.zeros_like(router)
        dist.all_reduce(g, group=group)
        out = {"router.weight": g}
        for i, expert in enumerate(self.experts):
            for name, grad in _swiglu_grads(expert).items():
                dist.all_reduce(grad, group=self.edp_group)
                out[f"experts.{self.first + i}.{name}"] = grad
        if self.moe.shared_experts is not None:  # every rank's tokens: summed over every rank
            for name, grad in _swiglu_grads(self.moe.shared_experts).items():
                dist.all_reduce(grad, group=group)
                out[f"shared.{name}"] = grad
        return with_every_expert(out, self.ep_group, router.device)


def _load_swiglu(mlp, swiglu) -> None:
    """Megatron's gated MLP (``linear_fc1`` = [gate; up], ``linear_fc2`` = down) from the reference's SwiGLU."""
    mlp.linear_fc1.weight.copy_(torch.cat([swiglu.gate.weight, swiglu.up.weight]))
    mlp.linear_fc2.weight.copy_(swiglu.down.weight)


def _swiglu_grads(mlp) -> dict:
    def grad(p):
        return p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)

    gate, up = grad(mlp.linear_fc1.weight).chunk(2)
    return {"gate.weight": gate, "up.weight": up, "down.weight": grad(mlp.linear_fc2.weight)}


def moe_submodules(layer_spec):
    """The ``MoESubmodules`` of a local layer spec built with experts: its ``mlp`` is a ``ModuleSpec`` (megatron-core
    0.15-0.17: ``.submodules``) or, from 0.18, ``functools.partial(MoELayer, submodules=...)``."""
    import functools

    mlp = layer_spec.submodules.mlp
    return mlp.keywords["submodules"] if isinstance(mlp, functools.partial) else mlp.submodules
