"""The stack findings: the known non-conformances of third-party implementations of this paradigm
(``harness.records.findings``: what a finding is and how the suites consult it)."""

from __future__ import annotations

import math

from harness.records.findings import Finding

FINDINGS = (
    Finding("deepspeed", "stack", "deepspeed", ("0.18.9", None),
            "DeepSpeed's bf16 at ZeRO 0 wraps the client optimizer in FP16_UnfusedOptimizer, whose constructor "
            "(initialize_optimizer_states) steps it once with zero gradients to create its state: torch's Adam then "
            "counts that step, and every real step is bias-corrected as the next one — each master's first move is "
            "0.744 lr where torch's Adam moves it by lr (0.526 / sqrt(0.5)), silently; torch's AdamW also decays every "
            "master once in that step, before training (x (1 - lr weight_decay)) (its ZeRO 1-3 optimizers no "
            "longer step at construction — the change DeepSpeed PR 5104 proposed; FP16_Optimizer, fp16's with a fused "
            "optimizer, still does too). Minimal case: one rank, a Linear, bf16 ZeRO 0, torch's Adam: "
            "its step count is 1 after deepspeed.initialize and 2 after one engine.step. In the stack: every master "
            "not Adam's step of DeepSpeed's own state (4e5 x fp32's rounding), then the first moments off at step 2.",
            "suites/stack/test_deepspeed_findings.py::test_watch_deepspeed_bf16_zero0_counts_a_zero_gradient_adam_step",
            {"optimizer": lambda name: name in ("adam", "adamw"), "zero": 0, "dtype": "bfloat16", "pp": 1,
             "checkpointing": False},  # AdamW's step count too
            # the masters' replay is the cause (step 1 on); from step 2 what they move: moments, norm, loss
            symptom=r"^rank \d+: (step \d+: (master \S+: not Adam's step \d+ of the stack's own state|(parameter|"
                    r"optimizer state) \S+: off by|gradient norm \S+ vs one device)|loss after step \d+:)",
            cause=r"step 1: master \S+: not Adam's step 1 of the stack's own state"),
    Finding("deepspeed", "stack", "deepspeed", ("0.19.8", None),
            "DeepSpeed's Muon (optimizer type Muon) decides which parameters Muon takes by name, overwriting the "
            "user's own use_muon tags: every parameter of two or more dimensions whose name holds neither 'embed' nor "
            "'lm_head' (set_optimizer_flags) — an LM head named otherwise (Megatron's output_layer, torchtitan's "
            "output, this suite's head) is orthogonalised by Muon instead of stepped by AdamW, silently (minimal "
            "case: a model of an 'embed' and a 'head' Linear, head.weight.use_muon = False before "
            "deepspeed.initialize: True after, in the Muon group). In the stack: the head's parameter and its "
            "momentum instead of AdamW's moments, then every weight after step 2.",
            "suites/stack/test_deepspeed_findings.py::test_watch_deepspeed_muon_takes_an_lm_head_not_named_lm_head",
            {"optimizer": "muon"},
            # after step 1 only the head is off (every other tensor's update reads its own gradient alone); from
            # step 2 on, everything the head's output reaches
            symptom=r"^rank \d+: (step 1: (parameter|optimizer state) head\.weight\S*: |step (?!1:)\d+: (parameter|"
                    r"optimizer state) \S+: |loss after step (?!1:)\d+:)",
            cause=r"head\.weight"),
    Finding("deepspeed", "stack", "deepspeed", ("0.19.8", None),
            "DeepSpeed's Muon at ZeRO 1-3 orthogonalises each Muon matrix's update into its gradient partition "
            "before the norm is taken: the norm it reports and clips by (gradient_clipping) is the 2-norm of the "
            "Newton-Schulz updates (each ~ sqrt(min(rows, cols)), whatever the gradient's size) and the AdamW half's "
            "gradients, and clipping scales the update while the momentum keeps the unclipped gradient; its ZeRO 0 "
            "clips the gradients (minimal case: an embed, a 4 x 4 Linear and an lm_head, gradients of norm 7.3e-4: "
            "it reports 0.87). In the stack: norm 16.67 against the gradients' 1.288, every tensor off from step 1.",
            "suites/stack/test_deepspeed_findings.py::test_watch_deepspeed_zero_muon_clips_the_orthogonalised_update",
            {"optimizer": "muon", "clipped": True, "zero": lambda z: z > 0},
            # every tensor is off (the head finding's lines among them); the norm line is the cause
            symptom=r"^rank \d+: (step \d+: (gradient norm \S+ vs one device|(parameter|optimizer state) \S+: "
                    r"(off by|missing from the dense state|not a tensor of the one-device model))"
                    r"|loss after step \d+:)",
            cause=r"gradient norm \S+ vs one device"),
    Finding("torch", "stack", "torch", ("2.12", None),
            "torch.compile of a tensor-parallel block fed by a tensor-parallel embedding (RowwiseParallel, Replicate "
            "in, and out Replicate or — torchtitan's plan with sequence parallelism — Shard(1)) back-propagates no "
            "gradient into the embedding under FSDP2: all zeros, silently (without FSDP2 the backward raises in "
            "DTensor's Redistribute.backward: 'Tensor' object has no attribute '_local_tensor'). Minimal case: "
            "Embedding(10, 8) + a residual Colwise / Rowwise MLP compiled, tp 2, FSDP2 over one dp rank, with or "
            "without sequence parallelism; eager, one device's gradient. In the torch stack: every compiled layout "
            "with tp > 1 — the embedding's gradient (and momentum) off, then every weight after step 2 (torchtitan's "
            "own Llama plan, compiled on the same layout, passes). Seen on 2.12.1, 2.13.0, 2.15.0 (CPU, gloo).",
            "suites/stack/test_findings.py::test_watch_a_compiled_tp_block_after_a_tp_embedding_drops_its_gradient",
            {"compile": True, "tp": lambda t: t > 1},
            symptom=r"^rank \d+: (step \d+: (gradient norm \S+ vs one device"
                    r"|(parameter|optimizer state|master) \S+: off by)|loss after step \d+:)",
            cause=r"(parameter|optimizer state) embed\.weight\S*: off by"),
    Finding("torch", "stack", "torch", ("2.12", None),
            "torch.distributed.pipelining over stages in DistributedDataParallel (the DDP support its PipelineStage "
            "has: no_sync but for the last micro-batch; every forward outside it) raises at a stage's forward after "
            "the first step ran two of that stage's backwards with no forward between them: DDP's bucket rebuild "
            "asserts ('rebuilt parameter indices size is not same as original model parameters size': every "
            "parameter recorded twice — in the stack a stage's 28 parameters, 56 recorded); the first step's "
            "gradients are right. So GPipe over 2 or more micro-batches, and every other schedule (1F1B, ZB-H1, "
            "interleaved, interleaved zero bubble, ZB-V, DualPipeV) whose micro-batches are 2 or more and no more "
            "than its stages (pp, or 2 pp: its first stage runs every forward before its first backward) — measured "
            "at pp 1, 2 and 3, micro-batches 1 to 12; more micro-batches than stages train (torch's own test_pp_ddp "
            "runs one step, so never sees it). Minimal case: a Linear(3, 3) in DDP over 2 ranks as a one-stage "
            "pipeline, GPipe over 2 micro-batches: step 2 raises. In the torch stack: ZeRO 0 / 1 (DDP) under those "
            "schedules and micro-batch counts. Seen on 2.12.1, 2.13.0, 2.15.0 (CPU, gloo).",
            "suites/stack/test_findings.py::test_watch_ddp_under_pipelining_raises_after_two_backwards_in_a_row",
            {"zero": lambda z: z < 2, "dp": lambda d: d > 1, "layout": lambda lay: _backwards_in_a_row(lay)},
            symptom=r"rebuilt parameter indices size is not same as original model parameters size"),
    Finding("torch", "stack", "torch", ("2.12", None),
            "torch.distributed.pipelining's zero-bubble schedules (ZB-H1, interleaved zero bubble, ZB-V, DualPipeV) "
            "over stages in DistributedDataParallel never all-reduce the gradients of any stage but the first (and, "
            "under DualPipeV, the last: its rank 0 holds both) — their split backward calls autograd's grad "
            "directly, past the hooks DDP reduces in (pytorch #144530, open; torch's test_pp_ddp skips the case): "
            "each replica of those stages steps with its own gradient, silently. Minimal case: dp 2 x pp 2, a "
            "Linear(3, 3) per stage, ZB-H1 over 2 micro-batches: the first stage's replicas hold one gradient after "
            "the step, the last stage's two (measured at pp 1, 2 and 3: interleaved zero bubble and ZB-V reduce "
            "stage 0 alone, even on one pipeline rank). In the torch stack: ZeRO 0 / 1 (DDP) under those schedules "
            "with such a stage — the gradient norm and every tensor off from step 1. Seen on 2.12.1, 2.13.0, 2.15.0 "
            "(CPU, gloo).",
            "suites/stack/test_findings.py::test_watch_ddp_under_zero_bubble_reduces_only_the_first_stage",
            {"zero": lambda z: z < 2, "dp": lambda d: d > 1, "layout": lambda lay: _unreduced_stage(lay)},
            symptom=r"^rank \d+: (step \d+: (gradient norm \S+ vs one device"
                    r"|(parameter|optimizer state|master) \S+: off by)|loss after step \d+:)",
            cause=r"step 1: "),
    Finding("torch", "stack", "torch", ("2.12", None),
            "torch.distributed.pipelining over FSDP2 modules: a new schedule built on the same PipelineStage re-runs "
            "the stage's shape inference, whose clean-up sets every FSDP parameter's grad to None — gradients "
            "accumulated by earlier passes are dropped silently (one FSDP2 Linear, two GPipe steps without zeroing: "
            "the gradient is the second pass's alone; the stack at accumulation 2 was off by 3-16 %). Seen on 2.12.1, "
            "2.13.0, 2.15.0.",
            "suites/stack/test_findings.py::test_a_new_pipeline_schedule_drops_fsdp2_accumulated_gradients",
            handled_by_adapter="the torch stack builds one schedule and reuses it for every accumulation pass"),
    Finding("torch", "stack", "torch", ("2.12", None),
            "torch.nn.utils.get_total_norm(..., inf) — torchtitan's clip_grad_norm_ — raises on a rank whose FSDP2 "
            "shard of a gradient is empty ('_foreach_norm cannot compute the infinity norm on an empty tensor') "
            "while its peers wait in the reduction; the 2-norm works (minimal case: Linear(3, 1) over 2 ranks; in "
            "the stack: vocabulary 13 over tp 4 x dp 2, the last TP rank's one head row split over 2). Seen on "
            "2.12.1, 2.13.0, 2.15.0.",
            "suites/stack/test_findings.py::test_inf_norm_of_an_empty_fsdp_shard_raises",
            {"norm_type": math.inf}, symptom=r"cannot compute the infinity norm on an empty tensor"),
    Finding("torchtitan", "stack", "torchtitan", ("0.2.2", "0.3.0"),
            "torchtitan 0.2.x under DDP (data_parallel_replicate_degree > 1, nothing sharded) divides by dp twice: "
            "forward_backward_step divides each rank's summed loss by the batch mesh's counted targets and its "
            "apply_ddp (torch's replicate) averages the gradients over dp as well — every gradient / dp (minimal "
            "case: dp 2, Adam, clipped: norm 0.2527 against one device's 0.5054). 0.3 sums over replicas.",
            "suites/stack/test_torchtitan_findings.py::test_watch_torchtitan_02_ddp_divides_by_dp_twice",
            {"zero": 0, "dp": lambda d: d > 1},
            symptom=r"^rank \d+: (step \d+: (gradient norm \S+ vs one device"
                    r"|(parameter|optimizer state|master) \S+: off by)|loss after step \d+:)",
            cause=r"gradient norm \S+ vs one device|(parameter|optimizer state|master) \S+: off by"),
    Finding("torchtitan", "stack", "torchtitan", ("0.2.2", "0.3.0"),
            "torchtitan 0.2.x under pipeline parallelism back-propagates the summed loss: its schedule's loss_fn is "
            "the sum-reduced cross-entropy (scale_grads=False) and the global count of counted targets divides only "
            "the loss it reports — every gradient times that count (minimal case: pp 2, Adam, clipped: the reported "
            "norm is the count times one device's). 0.3 passes the count to the schedule (loss_kwargs).",
            "suites/stack/test_torchtitan_findings.py::test_watch_torchtitan_02_pipeline_back_propagates_the_summed_loss",
            {"pp": lambda p: p > 1},
            symptom=r"^rank \d+: (step \d+: (gradient norm \S+ vs one device"
                    r"|(parameter|optimizer state|master) \S+: off by)|loss after step \d+:)",
            cause=r"gradient norm \S+ vs one device|(parameter|optimizer state|master) \S+: off by"),
    Finding("torchtitan", "stack", "torchtitan", ("0.3", None),
            "torchtitan's Llama3 with a tied embedding (enable_weight_tying) under FSDP2 x TP: every parameter equals "
            "one device after step 1 and is off after step 2 (minimal case: dp 2 x tp 2, Adam, float32 — at lr 1e-2 "
            "0.0076 of a tensor's magnitude against a bound of 0.0056, at 5e-2 5.4x the bound; the reference stack on "
            "the same case 1.3e-6; FSDP alone and TP alone equal). The cause: parallelize_module gives the embedding "
            "and the head each its own DTensor parameter, fully_shard (one unit for tok_embeddings, norm, lm_head) "
            "manages them as two, and init_weights re-ties the modules after — FSDP2 holds two parameters where the "
            "modules share one (its state at dp 2 x tp 2: the embedding's and the head's FSDPParam apart; at dp 2 "
            "alone one, shared). The torch stack ties after TP and before fully_shard and equals one device on the "
            "same layout; tying after fully_shard (the planted TiedAfterFullyShard) is off from step 2 as torchtitan "
            "is (suites/stack/test_tied.py).",
            "suites/stack/test_torchtitan.py::test_watch_a_tied_embedding_under_fsdp_and_tp_is_off_at_step_two",
            {"tie_embeddings": True, "tp": lambda t: t > 1, "dp": lambda d: d > 1},
            symptom=r"^rank \d+: (step 2: |loss after step 2)", cause=r"^rank \d+: step 2: parameter"),
    Finding("torchtitan", "stack", "torchtitan", ("0.3", None),
            "torchtitan's MoE under expert x tensor parallelism without sequence parallelism cannot run a forward: "
            "set_moe_sharding_config hands the routed experts' output back sequence-sharded over tp (Shard(1), as "
            "its EP dispatch leaves it) and asks for Partial when SP is off, which DTensor refuses (RuntimeError: "
            "Can not redistribute from S(1) to P(sum); minimal case: the MoE family, dp 2 x tp 2, ep 2). With SP on "
            "the same layout equals one device.",
            "suites/stack/test_torchtitan_moe.py::test_watch_torchtitan_moe_under_ep_and_tp_without_sp_cannot_run",
            {"family": "moe", "ep": lambda e: e > 1, "tp": lambda t: t > 1, "sequence_parallel": False},
            symptom=r"Can not redistribute from S\(1\) to P\(sum\)"),
    Finding("megatron", "stack", "megatron-core", ("0.15.3", None),
            "megatron-core's GPTModel trains a vocabulary padded to a multiple of tp (Megatron-LM's "
            "_vocab_size_with_padding) and its vocab_parallel_cross_entropy takes the softmax over the padding's "
            "logits too: the loss and every gradient differ from one device's (minimal case in the stack: a Llama of "
            "vocabulary 13 at tp 2, padded to 14 — loss 2.926 vs 2.861 at step 1).",
            "suites/stack/test_megatron.py::test_megatron_with_a_vocabulary_tp_does_not_divide_is_the_known_finding",
            {"vocab_remainder": lambda r: r != 0}, symptom=r"^rank \d+: (step \d+: |loss after step)",
            cause=r"^rank \d+: loss after step 1: "),
    Finding("megatron", "stack", "megatron-core", ("0.15.3", None),
            "megatron-core's padded vocabulary (its softmax over the padding's logits, as untied) under a tied "
            "embedding: the padding's logits are the embedding's zero rows, 0 for every token — a small share of the "
            "softmax's sum where the embedding's logits are large — so the loss stays within the bound while every "
            "gradient is off (minimal case: the tied float32 Llama of vocabulary 13 at tp 2, Adam at lr 5e-2: "
            "blocks.0.attn.v.weight 0.009 of its magnitude off at step 1 against a bound of 0.0024; vocabulary 14 or "
            "16 on the same case equal one device). At lr 1e-2 it stays within the float32 bound: hidden — "
            "suites/stack/test_tied.py steps at 5e-2.",
            "suites/stack/test_megatron.py::test_megatron_tied_to_a_padded_vocabulary_is_the_known_finding",
            {"vocab_remainder": lambda r: r != 0, "tie_embeddings": True},
            symptom=r"^rank \d+: (step \d+: |loss after step)", cause=r"^rank \d+: step 1: parameter "),
    Finding("megatron", "stack", "megatron-core", ("0.15.3", "0.18.2"),
            "megatron-core with perform_initialization=False never marks its column-, row- and vocabulary-parallel "
            "weights tensor_model_parallel (set_tensor_model_parallel_attributes runs inside its initialisers only): "
            "its optimizer's grad norm then counts them on TP rank 0 alone — clipping by a wrong norm (minimal case: "
            "a Llama at tp 2, norm 1.499 against one device's 2.043).",
            "suites/stack/test_megatron.py::test_watch_megatron_without_initialisation_norms_tp_rank_0_alone",
            handled_by_adapter="the megatron stack lets Megatron initialise (perform_initialization=True), then loads "
                               "the one-device weights"),
    Finding("megatron", "stack", "megatron-core", ("0.16.1", None),
            "megatron-core's standard optimizer overrides spare a bias or a 1-D parameter from weight decay by "
            "marking its group wd_mult 0, but get_megatron_optimizer's groups all carry the config's weight_decay: "
            "only Megatron-LM's OptimizerParamScheduler (at construction and after each step) sets a group's decay "
            "to weight_decay x wd_mult — a megatron-core user stepping the optimizer without it decays every bias and "
            "norm, silently (minimal case: one rank, the GPT, weight_decay 0.1: groups (wd_mult 0, 0.1) and (1, 0.1) "
            "until the scheduler is built; in the stack, AdamW at weight_decay 2: every bias and norm 2 % off at step "
            "1).",
            "suites/stack/test_adamw.py::test_watch_megatron_core_spares_biases_and_norms_only_through_its_scheduler",
            handled_by_adapter="the megatron stack runs Megatron-LM's OptimizerParamScheduler (constant lr and weight "
                               "decay), stepped after each successful update as Megatron-LM's train_step does"),
    Finding("deepspeed", "stack", "deepspeed", ("0.19.8", None),
            "DeepSpeed's config schedulers (WarmupLR, WarmupCosineLR) set the optimizer's lr at construction to their "
            "value at iteration -1 and the engine steps them after each update: update k trains at iteration k - 2's "
            "lr — a linear warmup from 0 trains the first two updates at lr 0 and peaks one update late, and "
            "WarmupCosineLR never trains at its peak (its cosine starts one step in) (minimal case: one rank, a "
            "Linear, warmup 4 steps: lr x [0, 0, 0.25, 0.5, 0.75, 1] for WarmupLR, x [..., 0.75, 0.854] for "
            "WarmupCosineLR at total 8).",
            "suites/stack/test_deepspeed_findings.py::"
            "test_watch_deepspeed_config_schedulers_train_the_first_two_updates_at_one_lr",
            handled_by_adapter="the deepspeed stack gives the contract's schedule as a client scheduler (a LambdaLR "
                               "DeepSpeed builds over the optimizer it wraps), update k at position k - 1"),
    Finding("deepspeed", "stack", "deepspeed", ("0.19.8", None),
            "deepspeed.zero.Init leaves torch.nn.Module.__init_subclass__ replaced when it exits: it puts back the "
            "inherited object.__init_subclass__, bound to Module, as nn.Module's own attribute, which hides the "
            "__init_subclass__ of any mixin after nn.Module in a later class's MRO — torchtitan's Module(nn.Module, "
            "Configurable) then never wires its Config ('Config has no owner class'), in the same process, after "
            "any zero.Init (minimal case: a Base(nn.Module, Mixin) whose Mixin tags each subclass; a subclass defined "
            "after a zero.Init context is not tagged).",
            "suites/stack/test_deepspeed_findings.py::test_watch_zero_init_hides_later_classes_mixin_hooks",
            handled_by_adapter="the ZeroInit option puts torch.nn.Module's __init_subclass__ back as it found it"),
    Finding("megatron", "stack", "megatron-core", ("0.16.1", None),
            "megatron-core's Muon cannot be built with emerging-optimizers 0.3.0 (the one release on PyPI; "
            "megatron-core's dev / lts extras name it unpinned): its TensorParallelMuon passes use_nesterov= to "
            "OrthogonalizedOptimizer, which takes nesterov= (TypeError: OrthogonalizedOptimizer.__init__() missing 1 "
            "required keyword-only argument: 'nesterov'), and calls newton_schulz_tp(mode=...), which takes "
            "tp_mode= (minimal case: TensorParallelMuon([one 8 x 4 parameter]), Python 3.12).",
            "suites/stack/test_megatron_findings.py::test_watch_megatron_muon_does_not_construct_with_emerging_optimizers",
            handled_by_adapter="the Megatron stack declares Muon unsupported (its iteration is not torch's)"),
    Finding("megatron", "stack", "megatron-core", ("0.16", None),
            "megatron-core's batched p2p (batch_p2p_comm=True, its config default) under the interleaved schedule at "
            "pp = 2: each rank posts send_prev, recv_prev, send_next, recv_next to one peer, so an activation and a "
            "gradient sent the same way in one batch land in each other's buffers — on gloo, silently (minimal case: "
            "a 4-layer Llama, 1 x 2 x 1, 4 micro-batches: loss 2.987 vs 2.961 at step 1; 2 micro-batches equal).",
            "suites/stack/test_megatron.py::test_watch_megatrons_batched_p2p_swaps_messages_at_pp_2_interleaved",
            handled_by_adapter="the megatron stack runs the interleaved schedule with Megatron-LM's p2p "
                               "(overlap_p2p_comm, not batched)"),
    Finding("megatron", "stack", "megatron-core", ("0.16", None),
            "megatron-core's FP32Optimizer over torch's SGD cannot load a dist_checkpointing checkpoint: its "
            "sharded_state_dict(is_loading=True) calls init_state_fn, which get_megatron_optimizer leaves None for "
            "SGD (TypeError: 'NoneType' object is not callable; minimal case: one rank, SGD, save then load).",
            "suites/stack/test_megatron.py::test_watch_megatron_cannot_load_a_checkpoint_of_sgd",
            {"optimizer": "sgd"}, symptom=r"TypeError: 'NoneType' object is not callable"),
    Finding("megatron", "stack", "megatron-core", ("0.16", None),
            "megatron-core's distributed optimizer over torch's Adam (no Apex / TransformerEngine) cannot load its "
            "fully_reshardable checkpoint: the loader skips Adam's 'step' while _set_main_param_and_optimizer_states "
            "copies every state key, 'step' included (KeyError: 'step'; minimal case: one rank, ZeRO 1, save then "
            "load).",
            "suites/stack/test_megatron.py::test_watch_megatrons_distributed_optimizer_cannot_load_its_checkpoint",
            {"zero": 1}, symptom=r"KeyError: 'step'"),
    Finding("megatron", "stack", "megatron-core", ("0.15.3", None),
            "megatron-core's dist_checkpointing save (torch_dist, filesystem_async) measures each writer process's "
            "memory with psutil, which megatron-core does not declare as a dependency: without psutil every writer "
            "raises RuntimeError and the save waits for their results forever — a deadlock, not an error (minimal "
            "case: one rank, save; found by the release matrix's venv, which has no psutil).",
            "suites/stack/test_megatron_findings.py::test_watch_megatron_checkpoint_writer_needs_psutil_it_does_not_declare",
            handled_by_adapter="the megatron adapter's save refuses (unsupported, in one sentence) where psutil is "
                               "not installed"),
    # DeepSpeed's releases of the last 12 months (harness/records/release_matrix.py; measured 2026-12-03 at 0.18.0,
    # 0.18.9, 0.19.0, 0.19.4 and 0.19.8 on torch 2.13's CPU build): each range [first measured bad, first measured good)
    Finding("deepspeed", "stack", "deepspeed", ("0.18.0", "0.19.8"),
            "DeepSpeed's activation checkpointing calls get_accelerator().Stream(...) unconditionally, and its CPU "
            "accelerator's Stream is None: every checkpointed forward raises TypeError: 'NoneType' object is not "
            "callable (minimal case: 1 rank, a Llama, activation_checkpoint_interval 1; fixed by 0.19.8).",
            "suites/stack/test_deepspeed_releases.py::test_watch_checkpointing_on_a_cpu_calls_a_missing_stream",
            {"checkpointing": True}, symptom=r"^rank \d+: TypeError: 'NoneType' object is not callable"),
    Finding("deepspeed", "stack", "deepspeed", ("0.18.0", "0.19.4"),
            "DeepSpeed's PipelineEngine at ZeRO 1 clips by a norm smaller than the global 2-norm (the GPT over pp 2: "
            "7.64 against 11.55), as its ZeRO 0 does in every release — the parameters then off by the clipping "
            "(minimal case: a tied GPT, pp 2, max norm 0.05; right from 0.19.4).",
            "suites/stack/test_deepspeed_releases.py::test_watch_pipeline_zero1_clips_by_a_smaller_norm",
            {"zero": 1, "clipped": True, "pp": lambda pp: pp > 1},
            symptom=r"^rank \d+: (step \d+: (gradient norm \S+ vs one device|(parameter|optimizer state) \S+: off by)"
                    r"|loss after step \d+:)", cause=r"gradient norm \S+ vs one device"),
    Finding("deepspeed", "stack", "deepspeed", ("0.18.0", "0.19.0"),
            "DeepSpeed's ZeRO 2 (and ZeRO 1 when accumulating) raises on torch 2.13 in backward: RuntimeError "
            "'Output 0 of Split is a view and is being modified inplace' (its gradient partitions are views of a "
            "split modified in place; minimal case: a Llama, dp 2, ZeRO 2; fixed by 0.19.0).",
            "suites/stack/test_deepspeed_releases.py::test_watch_zero2_modifies_a_split_view_in_place",
            {"zero": lambda z: z in (1, 2), "pp": 1}, symptom=r"^rank \d+: RuntimeError: Output 0 of Split is a view"),
    Finding("deepspeed", "stack", "deepspeed", ("0.18.0", "0.19.0"),
            "DeepSpeed's BF16_Optimizer (a bf16 model, data_types.grad_accum_dtype fp32, ZeRO 1) reports a norm and "
            "moves momenta off one device's by tens of E_T (the Llama at dp 2, accumulating 2: norm 2.03 against "
            "1.38); right from 0.19.0.",
            "suites/stack/test_deepspeed_releases.py::test_watch_bf16_optimizer_with_fp32_accumulation_is_off",
            {"option": "harness.adapters.deepspeed.stack:Fp32GradAccum", "zero": 1},
            symptom=r"^rank \d+: step \d+: (gradient norm \S+ vs one device|(master|optimizer state) \S+: off by)"),
    Finding("accelerate", "stack", "accelerate", ("1.16.0", None),
            "accelerate applies its FSDP plugin only where its distributed type is an accelerator's: on a CPU, "
            "Accelerator(cpu=True, fsdp_plugin=...) sets MULTI_CPU and prepare() wraps the model in DDP — the "
            "sharding asked for is not done, and nothing says so (minimal case: 2 ranks, gloo, fsdp_version 2; "
            "ACCELERATE_USE_FSDP is set all the same).",
            "suites/stack/test_accelerate.py::test_watch_accelerate_ignores_its_fsdp_plugin_on_a_cpu",
            handled_by_adapter="the accelerate adapter refuses ZeRO 2 / 3 (unsupported, with the distributed type) "
                               "where accelerate's type is not FSDP"),
    Finding("accelerate", "stack", "accelerate", ("1.16.0", None),
            "accelerate's AcceleratedScheduler steps a prepared scheduler num_processes times per optimizer update "
            "(split_batches off, its default: each process's batch counted as one of the schedule's steps): a "
            "schedule written in updates — warmup, decay, total — runs num_processes times as fast, and nothing says "
            "so (minimal case: 2 processes on gloo, a LambdaLR: last_epoch 2, 4, 6 after updates 1-3).",
            "suites/stack/test_accelerate.py::test_watch_accelerate_steps_a_prepared_scheduler_once_per_process",
            handled_by_adapter="the accelerate stack writes the contract's schedule in accelerate's steps (a LambdaLR "
                               "of position // num_processes)"),
    Finding("deepspeed", "stack", "deepspeed", ("0.18.0", None),
            "DeepSpeed's engine at ZeRO stage 0 with a client torch optimizer clips the gradients (gradient_clipping) "
            "but get_global_grad_norm() returns None: the norm it clipped by is not reported (minimal case: 1 rank, "
            "a Llama, max norm 0.05; ZeRO 1-3 report it).",
            "suites/stack/test_deepspeed_findings.py::test_watch_deepspeed_reports_no_norm_at_zero_stage_0",
            {"zero": 0, "clipped": True, "pp": 1}, symptom=r"^rank \d+: step \d+: gradient norm None vs one device"),
    Finding("deepspeed", "stack", "deepspeed", ("0.18.0", None),
            "DeepSpeed's PipelineEngine at ZeRO stage 0 (fp32) clips by a norm of the first stage's gradients only: "
            "runtime.utils.clip_grad_norm_ counts a parameter where mpu.get_model_parallel_rank() == 0 or it is a "
            "tensor-parallel one, and the pipeline grid's model-parallel group is the pipeline itself, so every "
            "later stage's gradients are left out of the sum it all-reduces over the stages (minimal case: a "
            "Llama over pp 2, max norm 0.05: it clips by 1.139, the global 2-norm is 1.988; ZeRO 1 and bf16 are "
            "right).",
            "suites/stack/test_deepspeed_findings.py::test_watch_deepspeed_pipeline_clips_by_the_first_stages_norm",
            {"zero": 0, "clipped": True, "pp": lambda pp: pp > 1},
            symptom=r"^rank \d+: (step \d+: (gradient norm None vs one device|(parameter|optimizer state) \S+: off by)"
                    r"|loss after step \d+:)",
            cause=r"gradient norm None vs one device"),
    Finding("deepspeed", "stack", "deepspeed", ("0.18.9", None),
            "DeepSpeed's engine at ZeRO stage 0 with MoE layers over ep > 1 clips by the mean over the data-parallel "
            "ranks of each rank's own norm (runtime.utils.clip_grad_norm_: 'average total_norm across different GPUs "
            "due to the presence of moe params'), each over the dense gradients and that rank's experts only — not "
            "the global norm over every expert (minimal case: the moe family, dp 2 x ep 2, max norm 0.05: it clips "
            "by the mean of two rank norms, the global 2-norm is larger; ZeRO 1 / 2 are right).",
            "suites/stack/test_deepspeed_findings.py::test_watch_deepspeed_zero0_clips_moe_by_the_mean_of_rank_norms",
            {"zero": 0, "clipped": True, "ep": lambda ep: ep > 1, "family": "moe"},
            symptom=r"^rank \d+: (step \d+: (gradient norm None vs one device|(parameter|optimizer state) \S+: off by)"
                    r"|loss after step \d+:)",
            cause=r"(parameter|optimizer state) \S+: off by"),
    Finding("deepspeed", "stack", "deepspeed", ("0.18.9", None),
            "DeepSpeed's ZeRO 3 divides the sequence-parallel gradient by sp more than its ZeRO 0-2 do: with "
            "Ulysses (its engine given parallel_state_sp as mpu) ZeRO 0-2 sum the gradients over data x sequence "
            "ranks and divide by dp (each rank's loss its share), while ZeRO 3's reduce-scatter path "
            "(__avg_scatter_grads, its default) divides by dp x sp with no sequence-parallel correction (its "
            "contiguous all-reduce path has one) — a loss right at one stage is off by sp at the other (minimal case: "
            "a Llama, dp 1 x cp 2, SGD, one step: ZeRO 3's gradients are ZeRO 2's / 2).",
            "suites/stack/test_deepspeed_findings.py::test_watch_deepspeed_zero3_divides_the_sequence_parallel_gradient_by_sp",
            {"zero": 3, "cp": lambda cp: cp > 1},
            symptom=r"^rank \d+: (step \d+: (gradient norm \S+ vs one device|(parameter|optimizer state) \S+: off by)"
                    r"|loss after step \d+:)",
            cause=r"(parameter|optimizer state) \S+: off by"),
    Finding("deepspeed", "stack", "deepspeed", ("0.18.9", None),
            "DeepSpeed's engine given its (data, sequence) device mesh — data_parallel_size and "
            "sequence_parallel_size in its config, or mesh_param — reduces gradients over the data-parallel ranks "
            "only: groups._get_sequence_data_parallel_group falls back to the mesh's data_parallel group, so each "
            "sequence-parallel rank steps with its own shard's gradient (times sp) and the replicas drift apart "
            "(minimal case: dp 1 x sp 2, one step: seq_dp_world_size 1, the two ranks' parameters differ). Its HF "
            "integration's mpu (parallel_state_sp) reduces over both.",
            "suites/stack/test_deepspeed_findings.py::test_watch_deepspeed_sequence_parallel_mesh_never_reduces_over_sp",
            handled_by_adapter="the DeepSpeed Ulysses stack gives the engine DeepSpeed's parallel_state_sp as mpu, as "
                               "its HF integration does"),
    Finding("deepspeed", "stack", "deepspeed", ("0.18.9", None),
            "DeepSpeed's ZeRO 1 / 2 links the optimizer state to its parameters for the first parameter group only: "
            "_lazy_init_hp_params_optimizer_state runs once, after the first group's optimizer step, when the later "
            "groups (a MoE model's expert groups, which ZeRO asserts) have no state yet, so "
            "safe_get_full_optimizer_state raises 'momentum_buffer not found in optimizer state fragment' for every "
            "expert (minimal case: the moe family, dp 2 x ep 2, ZeRO 1, one step).",
            "suites/stack/test_deepspeed_findings.py::test_watch_deepspeed_links_the_optimizer_state_of_its_first_group_only",
            handled_by_adapter="the DeepSpeed MoE stack, its stack (engine and pipeline) trained with Muon (whose "
                               "AdamW half is the later group) or AdamW sparing the biases and norms (a second "
                               "group), and its ZeRO adapter with more than one group re-link the state before "
                               "reading it "
                               "(deepspeed_moe_stack.relink_optimizer_state), where DeepSpeed has the method"),
    Finding("deepspeed", "stack", "deepspeed", ("0.18.0", None),
            "DeepSpeed's checkpoints move between ZeRO stages 1 and 2 only: load_checkpoint of a ZeRO 0 checkpoint "
            "into ZeRO 1-3 raises FileNotFoundError (no zero_pp_rank optimizer files), of a ZeRO 1 / 2 one into ZeRO "
            "0 AttributeError, and across stage 3 either way — natively or through its universal checkpoint — no "
            "model file is found (a bare AssertionError in MegatronSDLoader.check_ckpt_list); none is said in a "
            "sentence (minimal case: a Llama, dp 2, Adam, one step at ZeRO 0, loaded at ZeRO 1).",
            "suites/stack/test_deepspeed.py::test_deepspeed_resume_across_layouts",
            {"zero_change": lambda z: z[0] != z[1] and not set(z) <= {1, 2}},
            symptom=r"^rank \d+: (FileNotFoundError: .*zero_pp_rank_\d+_mp_rank_\d+_optim_states\.pt|AssertionError: "
                    r"|AttributeError: 'NoneType' object)"),
)


def _backwards_in_a_row(layout) -> bool:
    """Whether ``layout``'s schedule runs two of its first stage's backwards in a row in the first step: GPipe over
    2 or more micro-batches; any other schedule over 2 or more and no more than its stages."""
    m = layout.num_microbatches
    return m >= 2 and (layout.schedule == "gpipe" or m <= layout.stages)


def _unreduced_stage(layout) -> bool:
    """Whether ``layout``'s zero-bubble schedule holds a stage DDP does not reduce: any but stage 0 (DualPipeV's last
    stage too, on rank 0 with it)."""
    from reference.pipeline.generators import SPLIT_BACKWARD

    return layout.schedule in SPLIT_BACKWARD and layout.stages > (2 if layout.schedule == "dualpipev" else 1)
