"""DeepSpeed-Ulysses inside its engine: context parallelism under the DeepSpeed stack, every block's attention a
``deepspeed.sequence.layer.DistributedAttention`` (``deepspeed_ulysses.py``'s module: its all-to-alls, the
rotary embedding at each token's global position, the causal mask by global position) and the engine told its
sequence-parallel groups the way its HF integration does — DeepSpeed's own ``parallel_state_sp`` as the engine's
``mpu`` (what ``UlyssesSPAttentionHF.register_with_transformers`` returns). The engine then reduces gradients over
data x sequence ranks and divides by dp (``_reduce_non_expert_gradients``; ZeRO 3 by dp x sp: a finding), its
ZeRO partitions over the same group: each rank's loss is its sequence shard's summed cross-entropy over its share
of the global batch's counted targets (``token_share`` over dp x accumulation), which sums to its replica's.

Each rank takes its zigzag shard of its replica's rows (the contract's layout; Ulysses is layout-agnostic: the
mask is by global position). The Llama family (the GPT's attention is another module; the moe family's experts
are another adapter), float32, no pipeline.

Not the other way its config offers: ``data_parallel_size`` / ``sequence_parallel_size`` (or ``mesh_param``) build a
(data, sequence) device mesh inside ``deepspeed.initialize``, and with it the engine reduces gradients over the
data-parallel ranks only — each sequence rank steps with its own shard's gradient (a finding, watched)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.adapters.deepspeed.ulysses import _Ulysses


def unsupported(spec, layout, recipe) -> str | None:
    """Why the DeepSpeed stack cannot train this case through its Ulysses attention, or None."""
    if spec.family != "llama":
        return f"the DeepSpeed stack composes Ulysses with the llama family's attention here, not the {spec.family}'s."
    if layout.pp > 1 or layout.checkpointing:
        return "the DeepSpeed stack's PipelineModule (pp, activation checkpointing) is not composed with Ulysses here."
    if spec.kv < layout.cp:
        return (f"DeepSpeed-Ulysses does not replicate KV heads: kv_heads ({spec.kv}) must be at least the sequence "
                f"parallel size ({layout.cp}).")
    if spec.dtype != "float32":
        return f"the DeepSpeed Ulysses stack trains float32, not {spec.dtype}."
    return None


class StackUlysses(_Ulysses):
    """The Ulysses attention in a Llama block: forward(x, positions) — positions are the layout's global ones,
    computed inside from the group (the block's are the shard's local ones)."""

    def __init__(self, dense, group):
        super().__init__(dense, group, "zigzag")

    def forward(self, x, positions=None):
        return super().forward(x)


def sequence_parallel_state(cp: int):
    """DeepSpeed's own sequence-parallel state (``deepspeed.runtime.sequence_parallel.parallel_state_sp``, the mpu
    its HF integration hands ``deepspeed.initialize``) over ``cp`` consecutive ranks. It is module-global and
    initialises once: kept where an earlier case left it at this cp; at another cp released first through its own
    ``_release_sequence_parallel_groups``, where DeepSpeed has it (else: unsupported, in one sentence)."""
    from deepspeed.runtime.sequence_parallel import parallel_state_sp as mpu

    from harness.contracts import Unsupported

    try:
        held = mpu.get_sequence_parallel_world_size()
    except AssertionError:  # not initialised
        held = None
    if held == cp:
        return mpu
    if held is not None:
        release = getattr(mpu, "_release_sequence_parallel_groups", None)
        if release is None:
            raise Unsupported(f"DeepSpeed's sequence-parallel state holds sp = {held} from an earlier case and this "
                              f"release offers no way to release it for sp = {cp}.")
        release()
    mpu.initialize_sequence_parallel(sequence_parallel_size=cp)
    return mpu


def ulysses_model(model, cp: int):
    """(the one-device Llama with every block's attention DeepSpeed's, the mpu to initialise its engine with)."""
    mpu = sequence_parallel_state(cp)
    group = mpu.get_sequence_parallel_group()
    for block in model.blocks:
        block.attn = StackUlysses(block.attn, group)
    return model, mpu


def shard(tokens: torch.Tensor, targets: torch.Tensor, cp: int):
    """This rank's zigzag shard of the sequence (rank = replica x cp + its cp rank: sequence innermost)."""
    from reference.context_parallel import positions

    idx = positions(tokens.shape[1], cp, dist.get_rank() % cp, "zigzag", tokens.device)
    return tokens[:, idx], targets[:, idx]
