"""torchtitan 0.2.x under the stack contract, through that release's own API: its ``Transformer`` built from a
``TransformerModelArgs`` of the spec's sizes, its ``parallelize_llama(model, parallel_dims, job_config)`` and
``pipeline_llm`` driven by a ``JobConfig``, its ``build_optimizers`` / ``build_cross_entropy_loss``, and the step
of its ``Trainer.train_step`` / ``forward_backward_step`` (0.2.2: the loss summed, divided by the batch mesh's
counted targets; under pp the schedule's backward runs on the summed loss). Everything else — the batch slicing,
clipping (``dist_utils.clip_grad_norm_``), the dense state, DCP save / load — is the 0.3 adapter's
(``torchtitan_stack.py``), whose calls 0.2.2 shares.

What 0.2 defines differently, and how the adapter maps it (the contract does not change):
- its rotary embedding is the complex one (``apply_rotary_emb``: dimension pairs (2i, 2i + 1)); the contract's
  Llama rotates halves (i, i + d / 2) — the same function after permuting each head's q / k rows, which the
  adapter applies loading the one-device weights and undoes reading them (parameters and Adam state alike);
  its Llama 3.1 frequency scaling is turned off (``RoPEScalingArgs(scaling_factor=1.0)``: the identity);
- its FFN size is derived (``int(2 x 4 dim / 3)`` times ``ffn_dim_multiplier``, rounded to ``multiple_of``): a
  multiplier that lands on the spec's ffn exactly, ``multiple_of`` 1;
- its learning-rate scheduler: ``build_lr_schedulers`` from the job's ``lr_scheduler`` section and
  ``training.steps`` — 0.3's function of the step, so the same mapping (``harness/adapters/torchtitan/lr.py``);
- bf16 as 0.2 trains it: FSDP2's mixed-precision policy, else (one rank, DDP) ``torch.autocast`` — its
  ``maybe_enable_amp`` (with TP or PP and no FSDP it trains fp32 and says so: unsupported);
- what 0.2 does not offer is unsupported in its words: weight tying (no such field), tensor parallelism without
  sequence parallelism (its ``apply_tp`` always shards the sequence), ZeRO 0 with tp or pp (its DDP: "DDP has
  not supported > 1D parallelism"), context parallelism, and the moe family (0.2's MoE is another module set,
  its kernels triton's, not driven here)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.adapters.torchtitan.names import contract_name, torchtitan_name
from harness.adapters.torchtitan.state import _scalar, materialise
from harness.adapters.torchtitan.trainer import SCHEDULES, TorchtitanStackTrainer
from harness.runtime.rank import rank_device

SEQ = 64
"""The rotary cache's length (``max_seq_len``): the contract's cases are shorter."""


def unsupported(spec, layout, recipe) -> str | None:
    """What torchtitan 0.2.x does not provide, in one sentence; None where the 0.3 refusals are all."""
    if spec.family == "moe":
        return ("the torchtitan stack drives 0.2.x's Llama3 (its Transformer); 0.2's MoE (torchtitan.models.moe, "
                "its permute kernels triton's) is not driven here.")
    if spec.tie_embeddings:
        return "torchtitan 0.2's Llama3 has no weight tying (TransformerModelArgs has no such field)."
    if layout.tp > 1 and not layout.sequence_parallel:
        return "torchtitan 0.2's apply_tp always shards the sequence: tp without sequence parallelism is not offered."
    if spec.dtype == "bfloat16" and (layout.zero == 0 or layout.dp == 1) and (layout.tp > 1 or layout.pp > 1):
        return ("torchtitan 0.2 trains bf16 through FSDP2 or, alone or under DDP, torch.autocast (its words: 'Mixed "
                "precision training with TP or PP is only supported when FSDP/HSDP/CP is enabled').")
    if recipe.optimizer.name == "adamw" and recipe.optimizer.decay != "all":
        return ("torchtitan 0.2's build_optimizers gives every parameter the one weight decay (no parameter groups): "
                "AdamW's rule 'matrices' (biases and norms not decayed) is 0.3's ParamGroupConfig.")
    if layout.zero == 0 and layout.dp > 1 and layout.world_size > layout.dp:
        return "torchtitan 0.2 replicates over dp with DDP alone (its words: 'DDP has not supported > 1D parallelism')."
    return None


def model_args(spec):
    """0.2's ``TransformerModelArgs`` of the spec's sizes."""
    from torchtitan.models.llama3.model.args import RoPEScalingArgs, TransformerModelArgs

    base = int(2 * 4 * spec.hidden / 3)  # FeedForward's hidden_dim before the multiplier
    return TransformerModelArgs(dim=spec.hidden, n_layers=spec.layers, n_heads=spec.heads, n_kv_heads=spec.kv,
                                vocab_size=spec.vocab, multiple_of=1, ffn_dim_multiplier=(spec.ffn + 0.5) / base,
                                norm_eps=spec.norm_eps, rope_theta=spec.rope_theta, max_seq_len=SEQ,
                                rope_scaling_args=RoPEScalingArgs(scaling_factor=1.0))


def _rows(heads: int, weight: torch.Tensor, to_pairs: bool) -> torch.Tensor:
    """q / k rows per head from the rotate-half order (i, i + d / 2) to the pairs (2i, 2i + 1), or back."""
    d = weight.shape[0] // heads
    shape = (heads, 2, d // 2) if to_pairs else (heads, d // 2, 2)
    return weight.reshape(*shape, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


class TorchtitanV02Trainer(TorchtitanStackTrainer):
    def _job(self):
        from torchtitan.config import JobConfig

        layout, spec = self.layout, self.spec
        job = JobConfig()
        replicate = layout.dp if layout.zero == 0 else layout.replicate  # HSDP: dp_replicate x dp_shard
        p = job.parallelism
        p.data_parallel_replicate_degree, p.data_parallel_shard_degree = replicate, layout.dp // replicate
        p.tensor_parallel_degree, p.pipeline_parallel_degree = layout.tp, layout.pp
        p.fsdp_reshard_after_forward = "never" if layout.zero == 2 else "default"
        p.pipeline_parallel_schedule, p.pipeline_parallel_microbatch_size = SCHEDULES[layout.schedule], 1
        # 0.2.2 registers its expert-parallel overlap callback (CUDA streams: "Accelerator expected" on a CPU) on every
        # DualPipeV schedule, while its config documents the option as effective only with ep > 1: the option as
        # documented (what 0.3 does), so a dense DualPipeV runs torch's own overlap
        if hasattr(p, "pipeline_parallel_expert_parallel_overlap"):
            p.pipeline_parallel_expert_parallel_overlap = layout.ep > 1
        p.module_fqns_per_model_part = [[n.replace("lm_head", "output") for n in part]
                                        for part in self._interleaved_parts() or []] or None
        job.training.local_batch_size, job.training.seq_len = layout.num_microbatches, SEQ
        job.training.mixed_precision_param, job.training.mixed_precision_reduce = spec.dtype, "float32"
        job.activation_checkpoint.mode = "full" if layout.checkpointing else "none"
        job.compile.enable = layout.compile  # its per-block compile; the loss eager, as the one device's
        if layout.compile and hasattr(job.compile, "components"):
            job.compile.components = ["model"]
        opt = self.recipe.optimizer
        job.optimizer.name, job.optimizer.implementation = {"adam": "Adam", "adamw": "AdamW"}[opt.name], "for-loop"
        job.optimizer.lr, (job.optimizer.beta1, job.optimizer.beta2) = opt.lr, opt.betas
        job.optimizer.eps, job.optimizer.weight_decay = opt.eps, opt.weight_decay
        job.job.dump_folder = "/tmp"
        return job

    def _build(self, model):
        from torchtitan.components.loss import build_cross_entropy_loss
        from torchtitan.components.optimizer import build_optimizers
        from torchtitan.distributed import ParallelDims
        from torchtitan.distributed import utils as dist_utils
        from torchtitan.distributed.pipeline_parallel import pipeline_llm
        from torchtitan.models.llama3 import parallelize_llama
        from torchtitan.models.llama3.model.model import Transformer

        job, layout = self._job(), self.layout
        p = job.parallelism
        self.dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                                 cp=1, tp=layout.tp, pp=layout.pp, ep=1, etp=1, world_size=dist.get_world_size())
        self.dims.build_mesh()
        args = model_args(self.spec)
        with torch.device("meta"):  # Trainer.__init__'s order: meta model, parallelize, to_empty, init_weights
            titan = Transformer(args)
        self.loss_fn = build_cross_entropy_loss(job)
        self.loss_parallel = layout.tp > 1 and not p.disable_loss_parallel  # Trainer's train_context
        self.amp = dist_utils.maybe_enable_amp(self.dims, job.training.mixed_precision_param,
                                               rank_device().type)  # its autocast
        if layout.pp > 1:
            self.schedule, parts, self.first, self.last = pipeline_llm(
                titan, self.dims, job, rank_device(), args, parallelize_llama, self.loss_fn)
        else:
            self.schedule, parts, self.first, self.last = None, [parallelize_llama(titan, self.dims, job)], True, True
        materialise(parts, self._titan_state(model))
        self.optimizers = build_optimizers(parts, job.optimizer, self.dims)
        self.lr_schedulers = None
        if self.recipe.lr_schedule is not None:  # its job's lr_scheduler section (harness/adapters/torchtitan/lr.py)
            from .lr import v02_schedulers

            self.lr_schedulers = v02_schedulers(self.recipe.lr_schedule, self.optimizers, job)
        self.last_grad_norm = None
        return parts

    def _titan_state(self, model) -> dict:
        out = {}
        for name, value in model.state_dict().items():
            value = value.detach().clone().to(torch.float32)
            if name.endswith(("attn.q.weight", "attn.k.weight")):
                value = _rows(self.spec.heads if ".q." in name else self.spec.kv, value, to_pairs=True)
            out[torchtitan_name(name, v02=True)] = value
        return out

    def _dense_entries(self, name: str, value, state: dict):
        dense = contract_name(name, v02=True)
        if dense.endswith(("attn.q.weight", "attn.k.weight")):
            heads = self.spec.heads if ".q." in dense else self.spec.kv
            value = _rows(heads, value, to_pairs=False)
            state = {k: _rows(heads, v, to_pairs=False) for k, v in state.items()}
        yield dense, value, state

    @staticmethod
    def _sum_over(count, mesh):
        from torchtitan.distributed import utils as dist_utils

        return dist_utils.dist_sum(count, mesh)

    def _forward_backward(self, parts, tokens, targets, global_tokens) -> float:
        """0.2.2's ``Trainer.forward_backward_step``: without pp the summed loss / the global count, back-propagated;
        with pp its schedule back-propagates the summed loss of each micro-batch (its ``loss_fn``, ``scale_grads``
        False), and the count only divides the loss it reports."""
        from torchtitan.distributed import utils as dist_utils

        with dist_utils.get_train_context(self.loss_parallel)():
            if self.schedule is None:
                with self.amp:  # bf16 alone or under DDP: torch.autocast (FSDP2: its policy; else a null context)
                    loss = self.loss_fn(parts[0](tokens), targets) / global_tokens
                loss.backward()
                return _scalar(loss)
            losses = [] if self.last else None
            args = (tokens,) if self.first else ()
            self.schedule.step(*args, target=targets if self.last else None, losses=losses, return_outputs=False)
        return sum(_scalar(v) for v in losses) / float(global_tokens) if self.last else 0.0
