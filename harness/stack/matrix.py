"""``paritybench bench matrix`` (the last stage of ``bench all``, the main job): every installed stack held to
one device over one fixed set of cases, into the run folder's ``conformance.csv`` — so the main job's report
carries the conformance matrix (``harness.stack.report.stack_matrix_section``: case x stack, pass / FAIL /
finding / unsupported / refused, each non-pass cell's sentence below), the table a design review takes.

One recipe every stack here trains: float32 (torchtitan's and Megatron's rotary embeddings compute in it),
Adam with eps 1e-3 (torchtitan has no SGD; Megatron's distributed optimizer is Adam only; the eps: see
suites/stack/test_torchtitan.py), two steps. The Llama of the stack suite's sizes with 4 layers (Megatron's
interleaved split is even) and a vocabulary of 16 (every tp here divides it: the padded-vocabulary finding is
the suite's own case); each row varies one thing from the 1-rank base — a dp layout at each ZeRO stage, each
pipeline schedule, tp with and without sequence parallelism, tp x dp with checkpointing, and the seams
(2-norm and inf-norm clipping, accumulation, a tied embedding), Muon (torch's, with its AdamW) clipped over
FSDP / ZeRO 2, and AdamW sparing the biases and norms under a learning-rate warmup. A stack that does not provide
a row says so in its one sentence; the suite (``suites/stack``) holds every stack over many more layouts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.contracts.stack import SCHEDULES
from harness.runtime.bench_case import STDERR


def cases() -> list[tuple[str, object, object, object]]:
    """(what the row varies, spec, layout, recipe)."""
    from reference.models import ModelSpec
    from reference.zero import LRSchedule, OptimizerSpec

    from ..contracts.stack import Layout, Recipe

    llama = ModelSpec("llama", vocab=16, hidden=16, heads=8, kv_heads=2, ffn=24, layers=4, dtype="float32")
    tied = ModelSpec(**{**llama.as_dict(), "tie_embeddings": True})
    adam = Recipe(optimizer=OptimizerSpec("adam", 1e-2, eps=1e-3))
    muon = OptimizerSpec("muon", 0.02, momentum=0.95, weight_decay=0.1, adamw_lr=1e-2, eps=1e-3)  # test_muon.py's
    adamw = OptimizerSpec("adamw", 1e-2, eps=1e-3, weight_decay=2.0, decay="matrices")  # test_adamw.py's
    # factors 1/3, 2/3 over the two steps (a scheduler one update ahead, or stepped per micro-step, is off by half an
    # update); the warmup every scheduler here can be told (torchtitan's starts at 1 / (warmup + 1))
    warmup = LRSchedule(warmup=2, start=1 / 3, stable=1, decay="cosine", total=5, min_ratio=0.1)

    def with_(**kw):
        return Recipe(**{**adam.__dict__, **kw})

    out = [("one rank", llama, Layout(), adam)]
    out += [(f"dp 2, ZeRO {z}", llama, Layout(2, zero=z), adam) for z in range(4)]
    out += [(f"pp 2, {s}", llama, Layout(1, 2, 1, schedule=s), adam) for s in SCHEDULES]
    out += [("tp 2", llama, Layout(1, 1, 2), adam),
            ("tp 2 + sequence parallel", llama, Layout(1, 1, 2, sequence_parallel=True), adam),
            ("dp 2 x tp 2, ZeRO 2, checkpointing", llama, Layout(2, 1, 2, zero=2, checkpointing=True), adam),
            ("clip 2-norm, tp 2", llama, Layout(1, 1, 2), with_(max_grad_norm=0.05)),
            ("clip inf-norm, dp 2", llama, Layout(2, zero=2), with_(max_grad_norm=0.02, norm_type=math.inf)),
            ("accumulation 2, dp 2", llama, Layout(2), with_(accumulation=2)),
            ("tied embedding, dp 2", tied, Layout(2), adam),
            ("tied embedding, pp 2", tied, Layout(1, 2, 1), adam),
            ("Muon, dp 2, ZeRO 2, clipped", llama, Layout(2, zero=2), Recipe(optimizer=muon, max_grad_norm=0.05)),
            ("AdamW (biases, norms spared) + lr warmup, dp 2, accumulation 2", llama, Layout(2),
             Recipe(optimizer=adamw, accumulation=2, lr_schedule=warmup))]
    return out


@dataclass
class MatrixSweep:
    impls: list = field(default_factory=list)
    """The stacks (registry names); every registered one that runs here when empty."""
    sizes: list = field(default_factory=list)
    """Only the cases of these world sizes; every case when empty."""

    @property
    def world_sizes(self) -> list[int]:
        return sorted({layout.world_size for _, _, layout, _ in cases()} & set(self.sizes or range(1, 1 << 10)))


def run_sweep(cfg: MatrixSweep, get_world, run_dir, progress=STDERR) -> int:
    """Every case for every stack, grouped by world size (one World each), each verdict a conformance row."""
    from harness.records import findings, registry

    from .judge import judged

    impls = cfg.impls or [s for s in registry.names("stack") if registry.skip_reason(registry.resolve(s, "stack"))
                          is None]
    rows = 0
    for n in cfg.world_sizes:
        world = get_world(n)
        for what, spec, layout, recipe in (c for c in cases() if c[2].world_size == n):
            for impl in impls:
                v = judged(world, impl, spec, layout, recipe)
                run_dir.append("conformance.csv", {**v["row"], "property": "test_matrix", "outcome": v["outcome"],
                                                   "collective": f"{what} ({v['row']['collective']})",
                                                   "detail": findings.detail_with(v["known"], v["row"]["detail"])})
                rows += 1
                print(f"matrix {impl} {what}: {v['outcome']}", file=progress)
    return rows
