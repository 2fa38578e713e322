"""A stack trained under a learning-rate schedule (``Recipe.lr_schedule``: warmup from a start, a stable peak, a
linear or cosine decay to a floor — ``reference.zero.lr_schedule``) equals one device stepping each update at the
schedule's learning rate — the schedule indexed by the updates taken, whatever the stack's scheduler counts.

Each stack runs it with its own scheduler, as its users configure it: the reference sets each group's lr before an
applied update; torch a ``LambdaLR`` over its optimizer; torchtitan its ``LRSchedulersContainer`` config (warmup
(s + 1) / warmup_steps and one peak step: the contract's start 1 / (warmup + 1), its own stable steps — what it
cannot express is unsupported in a sentence); Megatron-LM's ``OptimizerParamScheduler`` (the contract's own
convention: init_lr, warmup, decay steps, its WSD style), stepped in samples as Megatron-LM does; DeepSpeed a client
scheduler built over the engine's optimizer (its own config schedulers train update 1 at their iteration -1's lr: the
watch below); accelerate a prepared ``LambdaLR`` (which accelerate steps once per process per update: the adapter
writes it in those steps; the watch below).

The signal: every case trains 4 updates with Adam (or AdamW), whose update is lr x a normalised step — a factor off
by one position is 40-100 % of an update, against a bound of 0.3 % (float32). Accumulation and the pipeline are in the
cases because a scheduler stepped per micro-batch, or per pipeline pass, runs the schedule that many times as fast;
AdamW's two groups because a scheduler that sets only the first group's lr leaves the norms at the peak; Muon because
its matrices and its AdamW half are two optimizers to a torch user (a scheduler over one of them leaves the other at the
peak) and its step reads the scheduled lr twice (the decay, the shape-adjusted lr). Muon's cases are held as
suites/stack/test_muon.py holds them (its bfloat16 iteration's slack)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from harness.contracts.stack import Layout, Recipe
from harness.runtime.capabilities import require_dtype
from reference.models import ModelSpec
from reference.zero import LRSchedule, OptimizerSpec
from suites._support.stack import ADAM, EVERY_EXPERT, GPT, LLAMA32, MOE32, held, named_cases
from suites.stack.test_muon import LLAMA as MUON_LLAMA
from suites.stack.test_muon import LLAMA32 as MUON_LLAMA32
from suites.stack.test_muon import MUON
from suites.stack.test_muon import TIED32 as MUON_TIED32

STEPS = 4
COSINE = LRSchedule(warmup=1, start=0.5, decay="cosine", total=3, min_ratio=0.1)
"""Factors 0.5, 1, 0.55, 0.1 over the 4 updates: warmup, the peak, the cosine half way, the floor past total."""
WSD = LRSchedule(warmup=1, start=0.5, stable=1, decay="linear", total=4)
"""Warmup-stable-decay: 0.5, 1, 1, 0.5."""
COSINE_PEAK = LRSchedule(warmup=1, start=0.5, stable=1, decay="cosine", total=4, min_ratio=0.1)
"""0.5, 1, 1, 0.55: a cosine after one stable step (torchtitan's peak lasts two updates at least)."""
FROM_ZERO = LRSchedule(warmup=2, decay="linear", total=4, min_ratio=0.2)
"""Megatron's default start (init_lr 0): update 1 moves nothing (Adam's moments still do); 0, 0.5, 1, 0.6."""
ADAMW = OptimizerSpec("adamw", 1e-2, eps=1e-3, weight_decay=2.0, decay="matrices")
"""Two groups (suites/stack/test_adamw.py's): the schedule must reach the norms' and biases' group too; the decay
(1 - lr_k x wd) follows the scheduled lr."""
GPT32 = ModelSpec(**{**GPT.as_dict(), "dtype": "float32"})
GPT16V = ModelSpec(**{**GPT32.as_dict(), "vocab": 16})
LLAMA16V = ModelSpec(**{**LLAMA32.as_dict(), "vocab": 16})
"""The TP Llama: a vocabulary tp divides (Megatron pads 13 to 14 and softmaxes over the padding: its known finding)."""
LLAMA16 = ModelSpec(**{**LLAMA32.as_dict(), "dtype": "bfloat16"})
LLAMA_FP16 = ModelSpec(**{**LLAMA32.as_dict(), "dtype": "float16"})
MUON_WSD = LRSchedule(warmup=1, start=0.5, stable=1, decay="linear", total=4, min_ratio=0.1)
"""Moonlight's recipe's shape (Muon under warmup-stable-decay): 0.5, 1, 1, 0.55 — the decay of Muon's matrices (1 -
lr x wd), its adjusted lr and its AdamW half's lr all follow the scheduled lr."""


CASES = [  # (id, spec, layout, recipe)
    ("dp-cosine-adamw", GPT32, Layout(2), Recipe(optimizer=ADAMW, accumulation=2, lr_schedule=COSINE)),
    ("zero2-accumulate-wsd", LLAMA32, Layout(2, zero=2),
     Recipe(optimizer=ADAMW, accumulation=2, max_grad_norm=0.05, lr_schedule=WSD)),
    ("zero3-from-zero", LLAMA32, Layout(2, zero=3), Recipe(optimizer=ADAM, lr_schedule=FROM_ZERO)),
    ("zero1-cosine-sgd", GPT32, Layout(2, zero=1),
     Recipe(optimizer=OptimizerSpec("sgd", 0.05), accumulation=2, lr_schedule=COSINE)),
    ("tp-cosine", GPT16V, Layout(1, 1, 2), Recipe(optimizer=ADAMW, lr_schedule=COSINE)),
    ("tp-cosine-peak-llama", LLAMA16V, Layout(1, 1, 2), Recipe(optimizer=ADAMW, lr_schedule=COSINE_PEAK)),
    ("pp-accumulate-wsd", LLAMA32, Layout(1, 2, 1), Recipe(optimizer=ADAM, accumulation=2, lr_schedule=WSD)),
    ("hybrid-zero3-cosine", LLAMA32, Layout(4, zero=3, replicate=2),
     Recipe(optimizer=ADAM, lr_schedule=COSINE_PEAK)),
    ("bf16-zero1-cosine", LLAMA16, Layout(2, zero=1),
     Recipe(optimizer=replace(ADAMW, eps=1e-8, weight_decay=0.1), accumulation=2, lr_schedule=COSINE)),
    ("muon-zero1-wsd", MUON_TIED32, Layout(2, zero=1), Recipe(optimizer=MUON, accumulation=2, lr_schedule=MUON_WSD)),
    ("muon-tp-cosine", MUON_LLAMA, Layout(1, 1, 2), Recipe(optimizer=MUON, lr_schedule=COSINE)),
    ("muon-zero3-tied-from-zero", MUON_TIED32, Layout(2, zero=3),
     Recipe(optimizer=MUON, accumulation=2, lr_schedule=FROM_ZERO)),
    ("muon-fsdp-cosine", MUON_LLAMA32, Layout(2, zero=2), Recipe(optimizer=MUON, accumulation=2, lr_schedule=COSINE)),
    ("moe-ep-wsd", MOE32, Layout(2, ep=2), Recipe(optimizer=ADAM, accumulation=2, lr_schedule=WSD)),
    ("moe-bf16-ep-cosine-peak", EVERY_EXPERT, Layout(2, ep=2, zero=3),
     Recipe(optimizer=ADAM, accumulation=2, lr_schedule=COSINE_PEAK)),
]
THOROUGH = {"zero3-from-zero", "zero1-cosine-sgd", "tp-cosine", "tp-cosine-peak-llama", "pp-accumulate-wsd",
            "hybrid-zero3-cosine", "bf16-zero1-cosine", "muon-zero3-tied-from-zero", "muon-fsdp-cosine", "moe-ep-wsd",
            "moe-bf16-ep-cosine-peak"}
"""tox's budget: AdamW's two groups under warmup + cosine at ZeRO 0, and accumulation + clipping at ZeRO 2 under WSD
(every stack); Muon under WSD at ZeRO 1 (the reference's flat Muon; DeepSpeed's in the thorough env) and under a
cosine at tp 2 (the reference's gathered matrices, torch's Muon on DTensors); the rest — warmup from 0, SGD, TP, the
pipeline, the hybrid mesh, bf16, Muon at ZeRO 2 / 3, the MoE family over ep (the experts' own optimizer or groups: the
reference's, DeepSpeed's; torchtitan's Qwen3 MoE in bf16) — in the thorough env."""


@pytest.mark.parametrize("spec, layout, recipe", named_cases(CASES, THOROUGH))
def test_stack_under_a_schedule_equals_one_device(stack_impl, spec, layout, recipe, world_cache, conformance,
                                                  sweep):
    sweep.require(not (stack_impl == "deepspeed" and recipe.optimizer.name == "muon"),
                  "thorough: DeepSpeed's Muon under a schedule (its Muon compiles with inductor: ~18 s cold); tox "
                  "holds its Muon (test_muon.py) and its schedules (this file's other rows)")
    if spec.dtype != "float32":
        require_dtype(world_cache.get(layout.world_size), spec.dtype, conformance, suite="stack", impl=stack_impl)
    v = held(world_cache, conformance, stack_impl, layout.world_size, spec, layout, recipe, padded=True, steps=STEPS)
    assert v["outcome"] == "pass", v["problems"][:8]


def test_the_schedule_is_the_contract_s_function_of_the_updates_taken():
    """The factors each phase gives (exact where the arithmetic is: warmup fractions, the floor; a decay's half way
    within a rounding), and its bad inputs: one sentence each."""
    assert [COSINE.factor(s) for s in (0, 1, 3, 9)] == [0.5, 1.0, 0.1, 0.1]
    assert COSINE.factor(2) == pytest.approx(0.55, abs=1e-15)
    assert [WSD.factor(s) for s in range(5)] == [0.5, 1.0, 1.0, 0.5, 0.0]
    assert [FROM_ZERO.factor(s) for s in (0, 1, 2, 4)] == [0.0, 0.5, 1.0, 0.2]
    assert FROM_ZERO.factor(3) == pytest.approx(0.6, abs=1e-15)  # 0.2 + 0.8 x 0.5
    assert [LRSchedule(warmup=4, start=0.25).factor(s) for s in (0, 2, 4, 100)] == [0.25, 0.625, 1.0, 1.0]
    for kwargs, needle in ((dict(decay="cosine"), "needs total"),
                           (dict(decay="linear", warmup=2, stable=1, total=3), "greater than warmup \\+ stable = 3"),
                           (dict(total=5), "a constant schedule"),
                           (dict(warmup=-1), "warmup must be a whole number"),
                           (dict(start=1.5), "start is a fraction of lr"),
                           (dict(decay="step"), "decay must be one of constant, linear, cosine")):
        with pytest.raises(ValueError, match=needle):
            LRSchedule(**kwargs)


@pytest.mark.thorough  # ~2 s: the localisation's extra World calls; its shape rule is tested alone in tox
def test_a_scheduler_stepped_per_micro_step_is_localised_to_the_update_that_took_the_wrong_lr(world_cache,
                                                                                             conformance):
    """Planted ``ScheduleStepsPerMicroBatch`` (accumulation 2, warmup 3 from 1/4): its first wrong update is step 2's,
    taken at position 2's lr where one device's is position 1's — localised to it and said
    (harness/localise/shape.py, ``schedule``)."""
    from harness.stack.judge import hold

    plan = LRSchedule(warmup=3, start=0.25)
    v = hold(world_cache, conformance, "suites.stack.planted:ScheduleStepsPerMicroBatch", 2, GPT32, Layout(2),
             Recipe(optimizer=ADAM, accumulation=2, lr_schedule=plan), steps=3, localise=True)
    assert v["outcome"] == "fail", v["problems"][:4]
    loc = v["localised"]
    assert loc.shape[0] == "schedule" and "at position 2's lr" in loc.shape[1], loc.lines()
    assert "at step 2" in loc.lines()[1], loc.lines()



def test_the_one_device_schedule_does_not_advance_on_an_update_the_loss_scaler_skips():
    """The contract's rule in its oracle (harness/stack/precision.py's ``OneDevice``, the low-precision seam's one
    device): float16 under a loss scale of 2^20 overflows and skips its first update (the scale halving), and may skip
    again when the scale grows back; the schedule's position is the count of applied updates, each trains at its
    factor, and the exact (float64) run skips the same steps, so its state is the same number of updates old."""
    import torch

    from harness.runtime.capabilities import dtype_unsupported
    from harness.stack.inputs import global_batch
    from harness.stack.precision import OneDevice
    from reference.mixed_precision import DynamicLossScaler

    if why := dtype_unsupported(torch.float16):
        pytest.skip(f"unsupported on this machine: {why}")
    plan = LRSchedule(warmup=3, start=0.25)
    single = OneDevice(LLAMA_FP16.build(0), DynamicLossScaler(2.0**20, growth_interval=2), ADAM, plan)
    exact = OneDevice(LLAMA_FP16.build(0).double(), None, ADAM, plan)
    tokens, targets = global_batch(LLAMA_FP16.vocab, 4, 0, 8, False)
    seen = []
    for k in range(4):
        single.step(k, tokens, targets, None)
        exact.step(k, tokens, targets, None, skip=not single.applied)
        seen.append((single.applied, single.lr.taken, exact.lr.taken))
    applied = [a for a, _, _ in seen]
    assert not applied[0] and any(applied[1:]), seen  # the first skipped, a later one applied
    taken = list(itertools.accumulate(int(a) for a in applied))
    assert [t for _, t, _ in seen] == [e for _, _, e in seen] == taken, seen
    assert single.lr_factor == plan.factor(taken[-1] - 1), (seen, single.lr_factor)  # the last applied update's


def _torch_lrs(make, updates: int) -> list[float]:
    """The lr each of ``updates`` updates trains at under the scheduler ``make(optimizer)`` builds (lr 1: the
    factor), stepped after each update as torch's documentation does."""
    import warnings

    import torch

    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    with warnings.catch_warnings():  # SequentialLR steps its next scheduler with an epoch (its own deprecation)
        warnings.simplefilter("ignore")
        scheduler, out = make(opt), []
        for _ in range(updates):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            scheduler.step()
    return out


@pytest.mark.parametrize("decay", ["linear", "cosine"])
def test_torchs_own_schedulers_chained_are_the_contract_s_schedule_up_to_total(decay):
    """For a torch user who chains torch's schedulers rather than write a LambdaLR: ``SequentialLR`` of ``LinearLR``
    (start_factor = start, total_iters = warmup) and ``LinearLR`` (1 -> min_ratio) or ``CosineAnnealingLR`` (T_max =
    total - warmup, eta_min = min_ratio x lr), milestone warmup, is the contract's schedule at every position up to
    total (within float64 rounding: torch computes the cosine recursively). Past total torch's cosine rises again
    (CosineAnnealingLR is periodic, documented) where the contract holds the floor — so a total shorter than the
    training is not one chained cosine."""
    import math

    from torch.optim import lr_scheduler as L

    plan = LRSchedule(warmup=2, start=0.25, decay=decay, total=6, min_ratio=0.1)

    def chained(opt):
        warm = L.LinearLR(opt, start_factor=plan.start, end_factor=1.0, total_iters=plan.warmup)
        span = plan.total - plan.warmup
        down = L.CosineAnnealingLR(opt, T_max=span, eta_min=plan.min_ratio) if decay == "cosine" else \
            L.LinearLR(opt, start_factor=1.0, end_factor=plan.min_ratio, total_iters=span)
        return L.SequentialLR(opt, [warm, down], milestones=[plan.warmup])

    got = _torch_lrs(chained, plan.total + 2)
    want = [plan.factor(s) for s in range(plan.total + 2)]
    assert all(math.isclose(g, w, rel_tol=1e-12) for g, w in zip(got[:plan.total + 1], want, strict=False)), got
    past = got[plan.total + 1]
    assert (past > plan.min_ratio + 0.1) if decay == "cosine" else math.isclose(past, plan.min_ratio), (past, got)


def _older_checkpoint_into_a_scheduled_trainer(directory: str) -> str:
    """Rank side (one rank): the reference 3D trainer's checkpoint with its schedule position removed (as written
    before checkpoints held it), loaded into a trainer that runs a schedule — the sentence it raises."""
    import json
    from pathlib import Path

    from reference.resume.store import ResumeError
    from reference.resume.threed import load_3d, save_3d
    from reference.stack.compose import parallelize
    from reference.stack.topology import ParallelDims

    dims = ParallelDims(1, 1, 1)
    save_3d(directory, "step-1", parallelize(LLAMA_FP16.build(0).double(), dims, optimizer=ADAM), {})
    meta = Path(directory) / "step-1" / "metadata.json"
    data = json.loads(meta.read_text())
    del data["meta"]["lr_updates"]
    meta.write_text(json.dumps(data))
    scheduled = parallelize(LLAMA_FP16.build(0).double(), dims, optimizer=ADAM, lr_schedule=LRSchedule(warmup=2))
    try:
        load_3d(Path(directory) / "step-1", scheduled)
    except ResumeError as exc:
        return str(exc)
    return "loaded"


def test_a_checkpoint_without_the_schedule_position_is_a_sentence_not_a_restarted_warmup(world_cache, tmp_path):
    said = world_cache.get(1).run(_older_checkpoint_into_a_scheduled_trainer, str(tmp_path), timeout=120)[0]
    assert said == (f"{tmp_path}/step-1/metadata.json holds no learning-rate schedule position (lr_updates), but "
                    "this trainer runs a schedule: it would restart its warmup."), said
