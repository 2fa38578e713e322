"""DeepSpeed's mixture of experts inside its engine: the moe family under the DeepSpeed stack, every block's
MoE a ``deepspeed.moe.layer.MoE`` (``TopKGate``, ``MOELayer``'s all-to-all over its expert-parallel group,
``Experts``) and the engine doing what a DeepSpeed MoE user's engine does — the client optimizer's parameter
groups split into its MoE groups (``split_params_into_different_moe_groups_for_optimizer``, which ZeRO 1 / 2
asserts), the experts' gradients all-reduced over DeepSpeed's own expert-data-parallel group and divided by the
data-parallel size (``_reduce_expert_gradients``), their ZeRO 1 / 2 state partitioned over that group, the
global norm over both.

What the adapter chooses, and why (the layer's semantics are held in suites/expert_parallel: deepspeed_moe.py):
- the routing is DeepSpeed's gate: softmax scores, top-1 weighted by its probability (the family's
  ``renormalize=False``), top-2 by the two renormalised (``renormalize=True``), dropless
  (``drop_tokens=False``), the second expert the argmax of the rest (``top2_2nd_expert_sampling=False``);
- the balance loss is the family's sequence-wise one, computed beside DeepSpeed's gate from the gate's own
  weight (as a model with its own auxiliary loss does): DeepSpeed's ``l_aux`` (the Switch form over each
  rank's tokens, another function) is returned by its layer and not added — a user's model chooses which
  auxiliary loss it adds;
- layout: ep divides dp (DeepSpeed lays its expert groups over the data-parallel world: EP groups of ep
  consecutive ranks, an expert's replicas strided, the contract's layout); float32; no pipeline (its
  PipelineModule is not composed with its MoE here) and no ZeRO 3 (DeepSpeed asserts its native MoE is not
  supported there).

Full state: each rank reads its own experts through DeepSpeed's API (``safe_get_full_optimizer_state`` over the
expert-data-parallel group at ZeRO 1 / 2) and the EP group's ranks exchange them: every expert under its global
number on every rank."""

from __future__ import annotations

import re

import torch
import torch.distributed as dist
from torch import nn

from harness.stack.dense import gathered


def unsupported(spec, layout, recipe) -> str | None:
    """Why the DeepSpeed stack cannot train this moe-family case through its MoE layer, or None."""
    if spec.router != "softmax":
        return "DeepSpeed's TopKGate routes by the softmax only (no sigmoid scores with a selection bias)."
    if spec.top_k not in (1, 2):
        return f"DeepSpeed's MoE layer routes top-1 or top-2 here, not top-{spec.top_k}."
    if spec.shared_experts:
        return ("DeepSpeed has no shared expert (its use_residual is PR-MoE's learned mix of an MLP and the experts, "
                "another function).")
    if (spec.top_k == 1) == spec.renormalize:
        return ("DeepSpeed weights a top-1 expert by its probability and renormalises top-2's two: "
                f"renormalize={spec.renormalize} at top-{spec.top_k} is not what it computes.")
    if layout.pp > 1 or layout.checkpointing:
        return "the DeepSpeed stack's PipelineModule (pp, activation checkpointing) is not composed with its MoE here."
    if layout.zero == 3:
        return ("DeepSpeed asserts its native MoE is not supported with ZeRO stage 3 (\"Use AutoEP or choose ZeRO "
                "stage 1/2\").")
    if spec.dtype != "float32":
        return (f"the DeepSpeed MoE stack trains float32 (its gate computes in float32 whatever the model), not "
                f"{spec.dtype}.")
    return None


class _Block(nn.Module):
    """The family's block with DeepSpeed's MoE in place of the reference MoE; ``run`` returns the block's
    sequence-wise balance loss per row as the reference block does."""

    def __init__(self, block, ep: int):
        from deepspeed.moe.layer import MoE

        super().__init__()
        self.attn_norm, self.attn, self.mlp_norm = block.attn_norm, block.attn, block.mlp_norm
        dense = block.moe
        self.num_experts, self.top_k, self.renormalize = dense.num_experts, dense.top_k, dense.renormalize
        self.moe = MoE(dense.router.in_features, dense.experts[0], num_experts=dense.num_experts, ep_size=ep,
                       k=dense.top_k, min_capacity=0, drop_tokens=False, use_rts=False,
                       top2_2nd_expert_sampling=False)
        local = dense.num_experts // ep
        # the engine creates the groups (set_deepspeed_parallelism, in deepspeed.initialize), after the experts
        # are loaded: their place is read from DeepSpeed's documented layout (EP groups of ep consecutive ranks,
        # deepspeed.utils.groups), and checked against the group it made (``check``)
        self.first = dist.get_rank() % ep * local
        with torch.no_grad():
            self.moe.deepspeed_moe.gate.wg.weight.copy_(dense.router.weight)
            for i, expert in enumerate(self.moe.deepspeed_moe.experts.deepspeed_experts):
                expert.load_state_dict(dense.experts[self.first + i].state_dict())

    @property
    def ep_group(self):
        return self.moe.deepspeed_moe.ep_group

    def check(self) -> None:
        """After ``deepspeed.initialize``: this rank's experts are the ones its EP group routes to it."""
        place = dist.get_rank(self.ep_group) * (self.num_experts // dist.get_world_size(self.ep_group))
        if place != self.first:
            raise RuntimeError(f"DeepSpeed placed this rank's experts from {place}, not {self.first} (its EP groups "
                               "are not ep consecutive ranks): the adapter loaded the wrong experts.")

    def run(self, x, positions):
        from reference.models.moe import route, row_balance, row_balance_loss

        b, s, h = x.shape
        x = x + self.attn(self.attn_norm(x), positions)
        normed = self.mlp_norm(x)
        y, _ds_aux, _ = self.moe(normed)  # DeepSpeed's l_aux: not the family's balance loss (module docstring)
        logits = nn.functional.linear(normed.reshape(b * s, h), self.moe.deepspeed_moe.gate.wg.weight)
        _, experts, balance = route(logits, self.top_k, "softmax", self.renormalize)
        counts, psum = row_balance(balance, experts, b, self.num_experts)
        return x + y, row_balance_loss(counts, psum, s, self.top_k)


class MoEModel(nn.Module):
    """forward(tokens) -> (logits, the sum over layers and rows of the sequence-wise balance loss)."""

    def __init__(self, dense, ep: int):
        super().__init__()
        self.embed, self.ln_f, self.head = dense.embed, dense.ln_f, dense.head
        self.blocks = nn.ModuleList(_Block(block, ep) for block in dense.blocks)

    def forward(self, tokens):
        x, aux = self.embed(tokens), 0.0
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        for block in self.blocks:
            x, rows = block.run(x, positions)
            aux = aux + rows.sum()
        return self.head(self.ln_f(x)), aux


_EXPERT = re.compile(r"(blocks\.\d+\.moe\.)deepspeed_moe\.experts\.deepspeed_experts\.(\d+)\.(.+)")


def contract_names(model: MoEModel) -> dict:
    """{the engine module's parameter name: the one-device model's}: DeepSpeed's gate is the router, its local
    expert j expert first + j."""
    out = {}
    for name, _ in model.named_parameters():
        m = _EXPERT.fullmatch(name)
        if m:
            block = int(name.split(".")[1])
            out[name] = f"{m[1]}experts.{model.blocks[block].first + int(m[2])}.{m[3]}"
        else:
            out[name] = name.replace("moe.deepspeed_moe.gate.wg.", "moe.router.")
    return out


def optimizer_groups(model: nn.Module) -> list:
    """The client optimizer's parameter groups as DeepSpeed's ZeRO 1 / 2 asserts them for a model with MoE
    layers: the dense parameters, then one group per expert-data-parallel group."""
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    return split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()),
                                                                  "name": "dense"})


def every_expert(entries: dict, model: MoEModel) -> dict:
    """``entries`` (this rank's, under the one-device names) completed with its EP group's other ranks' experts."""
    group = model.blocks[0].ep_group
    if dist.get_world_size(group) == 1:
        return entries
    return {**gathered({k: v for k, v in entries.items() if ".moe.experts." in k}, group), **entries}


def relink_groups(optimizer, stage: int) -> bool:
    """``relink_optimizer_state`` where the finding bites: ZeRO 1 / 2 with more than one parameter group (a MoE's
    expert groups, Muon's AdamW half, AdamW's undecayed vectors). Returns whether it re-linked."""
    return stage in (1, 2) and len(getattr(optimizer, "param_groups", ())) > 1 and relink_optimizer_state(optimizer)


def relink_optimizer_state(optimizer) -> bool:
    """Work around DeepSpeed's ZeRO 1 / 2 linking the optimizer state of only its first parameter group to its
    parameters (``_lazy_init_hp_params_optimizer_state`` runs once, after the first group's step, when the later
    groups — the MoE groups — have no state yet: ``safe_get_full_optimizer_state`` then raises "not found in
    optimizer state fragment" for every expert; harness/records/findings.py). Re-links after the step through that same
    private method, where DeepSpeed has it; where it does not (another release), DeepSpeed's own behaviour is
    left as it is. Returns whether it re-linked."""
    relink = getattr(optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if relink is None or not hasattr(optimizer, "_hp_optimizer_states_linked"):
        return False
    optimizer._hp_optimizer_states_linked = False
    relink()
    return True
