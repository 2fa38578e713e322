"""transformers' own expert parallelism (5.x: ``from_pretrained(..., distributed_config=DistributedConfig(
ep_size=, fsdp_size=, ep_implementation="all_to_all"))``), rank side: a small Qwen3-MoE saved by one device,
loaded by every rank of the World under that config (its EP plan — the experts split over ``ep_size`` ranks,
tokens exchanged by all-to-all — over FSDP2 across the ranks), one forward and backward on this rank's rows
of the global batch, against the same checkpoint on one device on the whole batch: the loss and every
parameter's gradient (DTensors gathered).

float32: its experts' grouped GEMM (``torch._grouped_mm``) takes float32 / bf16 / fp16 only on a CPU. The
bound is the stack suite's for a model of these sizes (``harness.stack.case.bound``: a Llama MoE, one step).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from harness.runtime.rank import summed

SIZES = {"vocab_size": 32, "hidden_size": 16, "intermediate_size": 32, "moe_intermediate_size": 8,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
         "num_experts": 4, "num_experts_per_tok": 2}
ROWS, SEQ = 4, 8
_ORACLES: dict = {}


def save_model(path: str, seed: int = 0) -> None:
    """Driver side: a random small Qwen3-MoE (renormalised top-2, no balance loss) saved at ``path``."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    config = Qwen3MoeConfig(**SIZES, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                            max_position_embeddings=64, router_aux_loss_coef=0.0, output_router_logits=False,
                            tie_word_embeddings=False)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).float().save_pretrained(path)


def _grads(model, tokens) -> tuple[float, dict]:
    out = model(input_ids=tokens, labels=tokens)  # its causal-LM loss: the mean over the rows' shifted tokens
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return float(out.loss.detach()), {n: (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
                                      for n, g in grads.items()}


def run_case(path: str, ep: int, experts: str | None = None) -> dict:
    """Rank side: {"problems", "worst", "bound", "unsupported"} of transformers' EP over ``ep`` x (n / ep) ranks (FSDP
    over all n), its experts computed by ``experts`` (its ``experts_implementation``; None: its default) against one
    device's default. An implementation this machine cannot run (a CUDA kernel) is "unsupported": its error."""
    from transformers import AutoModelForCausalLM, DistributedConfig

    from harness.runtime.rank import computed_once
    from harness.stack.case import bound
    from reference.models import ModelSpec

    n, r = dist.get_world_size(), dist.get_rank()
    for key, value in (("RANK", r), ("LOCAL_RANK", r), ("WORLD_SIZE", n)):
        os.environ[key] = str(value)
    tokens = torch.randint(0, SIZES["vocab_size"], (ROWS, SEQ), generator=torch.Generator().manual_seed(1))
    want_loss, want = computed_once(  # the one-device oracle: rank 0's, broadcast
        _ORACLES, path, lambda: _grads(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), tokens))
    import inspect

    # each release through its own API: ep_implementation is a field from 5.23 (before it, its one dispatch)
    fields = inspect.signature(DistributedConfig).parameters
    config = DistributedConfig(ep_size=ep, tp_size=1, fsdp_size=n,
                               **({"ep_implementation": "all_to_all"} if "ep_implementation" in fields else {}))
    chosen = {} if experts is None else {"experts_implementation": experts}
    per = ROWS // n
    try:
        model = AutoModelForCausalLM.from_pretrained(path, distributed_config=config, dtype=torch.float32, **chosen)
        loss, got = _grads(model, tokens[r * per:(r + 1) * per])
    except (ImportError, ValueError, NotImplementedError, RuntimeError) as exc:
        if experts is None and isinstance(exc, RuntimeError):  # a failure, not a refusal
            raise
        # all ranks raise alike (its own refusal of the layout, or a kernel's of this machine, before the step's
        # collectives: 5.19's EP is all-reduce only, ep_size = tp_size)
        which = f"experts_implementation={experts!r}: " if experts else ""
        return {"problems": [], "worst": 0.0, "bound": 0.0,
                "unsupported": f"{which}{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    [total] = summed([loss])  # equal rows and tokens per rank: the mean of the rank means is the batch's
    spec = ModelSpec("moe", vocab=SIZES["vocab_size"], hidden=16, layers=2, heads=4, kv_heads=2, ffn=8, experts=4,
                     top_k=2, dtype="float32")
    limit = bound(1, ROWS * SEQ, spec, n)
    problems, worst = [], 0.0
    if abs(float(total) / n - want_loss) > limit * abs(want_loss):
        problems.append(f"rank {r}: loss {float(total) / n!r} vs one device {want_loss!r}")
    for name in sorted(set(want) | set(got)):
        if name not in got or name not in want:
            problems.append(f"rank {r}: gradient {name}: " + ("missing" if name not in got else "not the one device's"))
            continue
        rel = float((got[name] - want[name]).abs().max()) / max(float(want[name].abs().max()), 1e-30)
        worst = max(worst, rel)
        if not rel <= limit:
            problems.append(f"rank {r}: gradient {name}: off by {rel:.3g} of its magnitude > {limit:.3g}")
    return {"problems": problems, "worst": worst, "bound": limit, "unsupported": None}
