"""The tensor-parallel benchmark: forward + backward time per layer per implementation x TP size, and
the bytes each rank sends, counted, against ``cost_model`` (one all-reduce of the (s, b, h) activations
per column, row or embedding layer, two per MLP or attention block: half of ``tp_layer_comm_bytes``, which
counts a whole transformer layer's four; the LM head adds its cross-entropy's three (s, b) all-reduces).

Bytes are counted by wrapping ``torch.distributed``'s collectives for the duration of one step (each
call counted as its ring algorithm sends: ``cost_model.collective_bytes``). Our reference and
megatron-core call them; DTensor uses functional collectives, which the counter does not see: its
bytes read "not counted" (blank) rather than a wrong zero.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from harness.records import registry
from harness.runtime.bench_case import STDERR, call_case, declined
from harness.runtime.comm_count import counted_collectives
from harness.runtime.timing import summarize, time_iterations
from reference.cost_model import collective_bytes, tp_layer_comm_bytes


@dataclass
class TensorParallelSweep:
    impls: list[str] = field(default_factory=lambda: ["reference", "torch", "megatron"])
    world_sizes: list[int] = field(default_factory=lambda: [2, 4])
    kinds: list[str] = field(default_factory=lambda: ["column", "row", "mlp", "attention", "embedding", "lm_head"])
    vocab: int = 4096
    heads: int = 8
    seq: int = 256
    batch: int = 4
    hidden: int = 512
    ffn: int = 2048
    iters: int = 10
    warmup: int = 3


def bench_rank(impl_spec: str, kind: str, seq: int, batch: int, hidden: int, ffn: int, iters: int,
               warmup: int, vocab: int = 4096, heads: int = 8) -> dict:
    import torch
    import torch.distributed as dist

    from harness.runtime.world import rank_device

    n, device = dist.get_world_size(), rank_device()
    torch.manual_seed(0)
    from reference.tensor_parallel import DenseAttention

    dense = {"column": lambda: torch.nn.Linear(hidden, ffn), "row": lambda: torch.nn.Linear(ffn, hidden),
             "mlp": lambda: torch.nn.Sequential(torch.nn.Linear(hidden, ffn), torch.nn.GELU(),
                                                torch.nn.Linear(ffn, hidden)),
             "attention": lambda: DenseAttention(hidden, heads),
             "embedding": lambda: torch.nn.Embedding(vocab, hidden),
             "lm_head": lambda: torch.nn.Linear(hidden, vocab, bias=False)}[kind]().to(device)
    try:
        sharded = registry.load(impl_spec, "tensor_parallel").shard(kind, dense, None, False)
    except (NotImplementedError, ValueError) as exc:
        return {"unsupported": str(exc)}
    if kind == "embedding":
        tokens = torch.randint(0, vocab, (seq, batch), device=device)

        def step():
            sharded(tokens).sum().backward()
    else:
        width = ffn // n if kind == "row" else hidden
        x = torch.randn(seq, batch, width, device=device, requires_grad=True)
        target = torch.randint(0, vocab, (seq, batch), device=device)

        def step():
            (sharded(x, target) if kind == "lm_head" else sharded(x)).sum().backward()

    counter = [0.0]
    with counted_collectives(counter):
        step()
    return {"times": time_iterations(step, iters, warmup, device), "bytes_sent": counter[0]}


def predicted_bytes(kind: str, n: int, seq: int, batch: int, hidden: int, elem: int = 4) -> float:
    """One all-reduce of (s, b, h) per column (backward), row (forward) or embedding (forward) layer; two
    per MLP or attention block (half of ``tp_layer_comm_bytes``); the LM head: its input gradient's
    all-reduce plus the vocabulary-parallel cross-entropy's three all-reduces of (s, b) scalars (max,
    target logit, sum of exponentials — Megatron's reference algorithm)."""
    if kind in ("mlp", "attention"):
        return tp_layer_comm_bytes(batch, seq, hidden, n, elem) / 2
    activations = collective_bytes("all_reduce", n, seq * batch * hidden * elem)
    if kind == "lm_head":
        return activations + 3 * collective_bytes("all_reduce", n, seq * batch * elem)
    return activations


def run_sweep(cfg: TensorParallelSweep, get_world, run_dir, progress=STDERR) -> int:
    cases = list(itertools.product(cfg.world_sizes, cfg.impls, cfg.kinds))
    for done, (n, impl, kind) in enumerate(cases, 1):
        world = get_world(n)
        per_rank = call_case(world, bench_rank, impl, kind, cfg.seq, cfg.batch, cfg.hidden, cfg.ffn, cfg.iters,
                             cfg.warmup, cfg.vocab, cfg.heads)
        row = {"suite": "tensor_parallel", "op": kind, "impl": impl, "backend": world.backend, "world_size": n,
               "dtype": "float32", "iters": cfg.iters, "warmup": cfg.warmup, "count": cfg.seq * cfg.batch,
               "comm_bytes_predicted": predicted_bytes(kind, n, cfg.seq, cfg.batch, cfg.hidden)}
        said = declined(per_rank)
        if said:
            row.update(said)
        else:
            counted = max(r["bytes_sent"] for r in per_rank)
            row.update(status="ok", comm_bytes_measured=counted if counted or n == 1 else None,
                       **summarize([r["times"] for r in per_rank]))
        run_dir.append("benchmarks.csv", row)
        if progress:
            extra = f"p50 {row['time_p50_us'] / 1e3:.2f} ms" if row["status"] == "ok" else row["status"]
            print(f"[{done}/{len(cases)}] tensor_parallel n={n} {impl} {kind}: {extra}", file=progress, flush=True)
    return len(cases)
