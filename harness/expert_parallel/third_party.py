"""Rank side of the third-party reports: DeepSpeed's MoE layer against one device, part by part
(``harness.adapters.deepspeed.moe`` says what it defines differently and why the comparison is float32)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.runtime.rank import rank_device

from ..verdict import off
from .case import U64, Case, _dense, _inputs, bound

U32 = 2.0**-24


def deepspeed_aux(dense, x: torch.Tensor) -> torch.Tensor:
    """DeepSpeed's ``l_aux`` on the tokens ``x`` (its definition, ``sharded_moe.top1gating`` / ``top2gating``):
    top-1 E sum_i P_i c1_i, top-2 E^2 mean_i(P_i c1_i) — P the mean gate probability, c1 the fraction of
    first choices."""
    probs = torch.softmax(dense.router(x).float(), dim=-1)
    first = torch.nn.functional.one_hot(probs.argmax(-1), dense.num_experts).float().mean(0)
    E = dense.num_experts
    return E * (probs.mean(0) * first).sum() if dense.top_k == 1 else E * E * (probs.mean(0) * first).mean()


def deepspeed_moe_report(case_dict: dict) -> dict:
    """{part: largest relative difference} and the float32 bound, this rank: the output, the aux, the input
    gradient, the router's and every expert's gradient of sum(y g) + aux — held to one device computing the aux
    as DeepSpeed defines it (each rank's own tokens: ``deepspeed_aux``, summed over the ranks) — and how far
    its aux is from the contract's (the group's tokens, every assignment counted)."""
    from harness.adapters.deepspeed.moe import DeepSpeedMoE

    case = Case(**case_dict)
    return _report(case, lambda dense: DeepSpeedMoE().shard(dense, dist.group.WORLD, case.ep), deepspeed_aux,
                   "DeepSpeed's", torch.float32)


def megatron_aux(dense, x: torch.Tensor) -> torch.Tensor:
    """megatron-core's load-balancing loss on the tokens ``x``: the contract's E sum_i f_i P_i, except that under
    sigmoid routing f_i counts the top-k of the scores **without** the selection bias
    (``moe_utils.compute_routing_scores_for_aux_loss``; DeepSeek-V3's paper writes f_i so), not the experts the
    tokens were sent to."""
    from reference.models.moe import balance_loss

    if dense.scoring != "sigmoid":
        return dense(x)[1]
    _, _, balance = dense.route(x)
    unbiased = torch.sigmoid(dense.router(x)).topk(dense.top_k, dim=-1).indices
    return balance_loss(balance, unbiased, dense.num_experts)


def megatron_moe_report(case_dict: dict, dispatcher: str) -> dict:
    """``deepspeed_moe_report`` for megatron-core's ``MoELayer`` with its ``dispatcher`` (through the CPU redirect
    on a CPU), in float32 — its router's weight is float32 whatever the parameters' dtype and its routing softmax
    computes in float32 (``moe_utils.topk_softmax_with_capacity``): its aux is ``megatron_aux``
    over each rank's own tokens (its gradient injected by Megatron in backward, its value the one the layer
    logs); shared experts included."""
    from harness.adapters.megatron.moe import MegatronMoE

    case = Case(**case_dict)
    impl = MegatronMoE(dispatcher)
    with impl.context():  # Megatron's backward runs its code too
        return _report(case, lambda dense: impl.shard(dense, dist.group.WORLD, case.ep),
                       megatron_aux, "Megatron's", torch.float32, injected_aux=True)


def _report(case, shard, aux_of, whose: str, dtype, injected_aux: bool = False) -> dict:
    n, r, device = dist.get_world_size(), dist.get_rank(), rank_device()
    dense = _dense(case, n, device)
    x, g = _inputs(case, n, dense, device)
    dense, x, g = dense.to(dtype), x.to(dtype), g.to(dtype)
    xd = x.clone().requires_grad_()
    y, aux_contract = dense(xd)
    each = [aux_of(dense, xd[i * case.tokens:(i + 1) * case.tokens]) for i in range(n)]
    ((y * g).sum() + sum(each)).backward()
    want = {k: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
            for k, p in dense.named_parameters()}
    rows = slice(r * case.tokens, (r + 1) * case.tokens)
    aux_mine = each[r].detach()
    dense.zero_grad(set_to_none=True)
    module = shard(dense)
    x_local = x[rows].clone().requires_grad_()
    y_local, aux_local = module(x_local)
    # an injected aux (Megatron's) has its gradient from the layer's own backward; a returned one is added here
    ((y_local * g[rows]).sum() + (0.0 if injected_aux else aux_local)).backward()
    got = module.full_grads(dist.group.WORLD)
    unit = U32 if dtype == torch.float32 else U64
    limit = bound(case, n) * unit / U64  # the same term counts, in the dtype compared (DeepSpeed's gate: float32)
    parts = {"output": (y_local, y[rows]), "input gradient": (x_local.grad, xd.grad[rows]),
             "router gradient": (got["router.weight"], want["router.weight"])}
    parts.update({f"gradient {k}": (got.get(k), v) for k, v in want.items() if k.startswith(("experts.", "shared."))})
    parts[f"aux ({whose} definition)"] = (aux_local.reshape(1), aux_mine.reshape(1))
    out, problems = {}, []
    for what, (a, b) in parts.items():
        if a is None:
            problems.append(f"rank {r}: {what}: missing")
            continue
        rel, lines = off(what, a.detach(), b.detach(), limit)
        out[what], problems = rel, problems + [f"rank {r}: {p}" for p in lines]
    contract = float(aux_contract.detach())
    out["aux vs the contract's"] = abs(float(aux_local.detach()) - contract) / abs(contract)
    return {"parts": out, "problems": problems, "bound": limit}


def megatron_moe_probe(dispatcher: str) -> tuple[str, str]:
    """megatron-core's ``MoELayer`` (local spec, 4 experts over the World as its expert-parallel group, top-2,
    ``dispatcher`` "alltoall" or "allgather") built and run forward / backward on (3, 1, 8) float64 tokens:
    ("ran", "") or (exception type, megatron's line that raised it (file:line) and the message's first line)."""
    import traceback

    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.transformer_config import TransformerConfig

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1,
                                             expert_model_parallel_size=dist.get_world_size())
    try:
        cfg = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, ffn_hidden_size=8,
                                num_moe_experts=4, moe_router_topk=2, moe_token_dispatcher_type=dispatcher,
                                use_cpu_initialization=True, params_dtype=torch.float64, moe_aux_loss_coeff=0.0,
                                add_bias_linear=False, gated_linear_unit=True)
        from harness.adapters.megatron.moe import moe_submodules

        layer = MoELayer(cfg, moe_submodules(get_gpt_layer_local_spec(num_experts=4)))
        x = torch.randn(3, 1, 8, dtype=torch.float64, requires_grad=True)
        layer(x)[0].sum().backward()
        return "ran", ""
    except Exception as exc:  # noqa: BLE001 - what it raises is the observation
        frames = traceback.extract_tb(exc.__traceback__)
        # the line of megatron's that did it (its package's path: a venv named after it holds torch's frames too)
        frame = ([f for f in frames if "/megatron/core/" in f.filename.replace("\\", "/")] or frames)[-1]
        where = f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}"
        return type(exc).__name__, f"{where}: {str(exc).splitlines()[0][:160]}"
    finally:
        parallel_state.destroy_model_parallel()
