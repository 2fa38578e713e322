"""The stack contract: a whole trainer — ours, torch's, torchtitan's, Megatron's, DeepSpeed's, yours —
held to one device. Build it from (spec, layout, recipe), load the one-device model's state, step on the
global batch, hand back the dense state on every rank; optionally save and load in the stack's own format.

Names are ``reference.models``' (the one-device module's ``named_parameters``): mapping a stack's own
names onto them is the adapter's business, never a way to leave a tensor out — every parameter and every
optimizer state tensor of the one-device model must come back.

Optional, for ``bench stack``: ``memory()`` -> {"params", "grads", "optimizer"}: bytes of model state
this rank holds between steps; ``pipeline_events()`` -> [(action, start, end)] seconds of its last
pipeline pass (the measured bubble). Without them those columns are blank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from reference.models import ModelSpec
from reference.pipeline import GENERATORS
from reference.zero import LRSchedule, OptimizerSpec

SCHEDULES = tuple(GENERATORS)
CHECKPOINT_POLICIES = ("full", "selective")


@dataclass(frozen=True)
class Layout:
    """Where each rank sits. Ranks are ``dp x pp x cp x tp`` (TP innermost, then CP, then PP, then DP:
    torchtitan's neighbours); later dimensions (expert) arrive in ``extra`` and then as fields."""

    dp: int = 1
    """Data-parallel replicas; ``zero`` says how much of the training state they shard."""
    pp: int = 1
    """Pipeline ranks (stages: pp, or 2 pp with the interleaved schedules and the V-shaped ones)."""
    tp: int = 1
    """Tensor-parallel ranks per layer."""
    zero: int = 0
    """0: replicated (DDP); 1: optimizer state sharded over dp; 2: + gradients; 3: + parameters. FSDP's
    FULL_SHARD is 3 and SHARD_GRAD_OP is 2; hybrid sharding (shard within a group, replicate across) is a
    further dimension, ``replicate``."""
    schedule: str = "1f1b"
    """The pipeline schedule: gpipe, 1f1b, interleaved (two model chunks per rank), the split-backward ones zb-h1 and
    interleaved-zb (two chunks), and the V-shaped zbv and dualpipev (stages r and 2 pp - 1 - r on pipeline rank r:
    ``reference.pipeline.placement``). A stack that does not run one declares it unsupported."""
    microbatches: int | None = None
    """Microbatches per pipeline pass; None: 2 pp."""
    checkpointing: bool = False
    """Activation checkpointing of every block (recomputed in backward)."""
    checkpoint_policy: str = "full"
    """With ``checkpointing``: "full" (the block's forward recomputed whole) or "selective" (selective activation
    checkpointing: every matrix multiplication's output saved — torch's ``create_selective_checkpoint_contexts``
    with mm / addmm / bmm MUST_SAVE —, every other op recomputed)."""
    compile: bool = False
    """Each block compiled (``torch.compile``, inductor: torchtitan's per-block compile); the one device runs eager."""
    sequence_parallel: bool = False
    """Megatron's sequence parallelism inside each TP group (not context parallelism)."""
    cp: int = 1
    """Context-parallel ranks: each takes its zigzag shard of the sequence (rank r: chunks r and 2 cp - 1 - r
    of 2 cp); parameters replicated over cp, gradients reduced — and FSDP / ZeRO sharded — over dp x cp."""
    ep: int = 1
    """Expert-parallel ranks (the moe family): dividing dp x cp (torchtitan's and Megatron's layout), each
    MoE layer's experts split over EP groups of ep consecutive data x context ranks, an expert's replicas
    (its expert-data-parallel group) one rank of each EP group."""
    replicate: int = 1
    """Hybrid sharding (HSDP, torchtitan's dp_replicate x dp_shard): the dp x cp ranks as a replicate x shard mesh
    (torch's ``init_device_mesh((replicate, shard))``: consecutive ranks shard together), ZeRO ``zero`` within each
    shard group of dp x cp / replicate ranks, each reduced shard all-reduced across the replicas. 1: ZeRO over all of
    dp x cp; dp x cp: every shard group one rank (the (n, 1) mesh). Needs zero >= 1."""
    extra: dict = field(default_factory=dict, hash=False, compare=False)
    """Dimensions of later issues: a stack refuses keys it does not know."""

    def __post_init__(self):
        for name in ("dp", "pp", "tp", "cp", "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1; got {value!r}.")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero must be 0, 1, 2 or 3; got {self.zero!r}.")
        for name in ("checkpointing", "compile", "sequence_parallel"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False; got {getattr(self, name)!r}.")
        if self.sequence_parallel and self.tp == 1:  # else a stack that ignores it would pass a case labelled SP
            raise ValueError("sequence_parallel shards what tensor parallelism replicates: it needs tp > 1; got tp 1.")
        if self.microbatches is not None and (not isinstance(self.microbatches, int)
                                              or isinstance(self.microbatches, bool) or self.microbatches < 1):
            raise ValueError(f"microbatches must be a whole number >= 1 or None (2 pp); got {self.microbatches!r}.")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}; got {self.schedule!r}.")
        if (self.dp * self.cp) % self.ep:
            raise ValueError(f"ep ({self.ep}) must divide dp x cp ({self.dp * self.cp}): experts split over data- and "
                             "context-parallel ranks.")
        if not isinstance(self.replicate, int) or isinstance(self.replicate, bool) or self.replicate < 1 \
                or (self.dp * self.cp) % self.replicate:
            raise ValueError(f"replicate ({self.replicate!r}) must be a whole number dividing dp x cp "
                             f"({self.dp * self.cp}): the replicas of a hybrid-sharded mesh.")
        if self.checkpoint_policy not in CHECKPOINT_POLICIES:
            raise ValueError(f"checkpoint_policy must be one of {', '.join(CHECKPOINT_POLICIES)}; got "
                             f"{self.checkpoint_policy!r}.")
        if self.checkpoint_policy != "full" and not self.checkpointing:
            raise ValueError(f"checkpoint_policy {self.checkpoint_policy!r} applies with checkpointing=True.")
        if self.replicate > 1 and self.zero == 0:
            raise ValueError("replicate > 1 is hybrid sharding: it needs zero >= 1 (ZeRO 0 replicates everything "
                             "already).")

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tp

    @property
    def num_microbatches(self) -> int:
        return self.microbatches or 2 * self.pp

    @property
    def stages(self) -> int:
        """Pipeline stages: pp, or 2 pp under the schedules of two stages per rank (``reference.pipeline``'s
        ``stages_per_rank`` with two chunks for the interleaved ones)."""
        from reference.pipeline.generators import stages_per_rank

        return self.pp * stages_per_rank(self.schedule, 2)

    def label(self) -> str:
        return f"{self.dp}x{self.pp}x{self.tp}" + (f"-cp{self.cp}" if self.cp > 1 else "") + \
            (f"-ep{self.ep}" if self.ep > 1 else "") + (f"-r{self.replicate}" if self.replicate > 1 else "") + \
            ("-sac" if self.checkpoint_policy == "selective" else "") + ("-compiled" if self.compile else "")


@dataclass(frozen=True)
class Recipe:
    """How each step trains. The precision is the spec's ``dtype``: float64 / float32 train as they are;
    bfloat16 / float16 train with fp32 master weights and fp32 optimizer state (the only low-precision
    recipe the contract defines), the cross-entropy in fp32."""

    optimizer: OptimizerSpec = field(default_factory=lambda: OptimizerSpec("sgd", 0.05))
    """SGD with momentum by default (a missing gradient average shows; Adam's normalisation hides it)."""
    max_grad_norm: float | None = None
    """Clip the global gradient norm (every element counted once) to this; None: no clipping."""
    norm_type: float = 2.0
    """2 or inf."""
    accumulation: int = 1
    """Pipeline passes (gradient accumulation micro-steps) per optimizer step."""
    loss_scale: float | None = None
    """float16: a dynamic loss scaler starting here (halve on inf/NaN and skip, double after
    ``growth_interval`` clean steps); None: none."""
    growth_interval: int = 2
    low_precision: str | None = None
    """A float8 / MX recipe (``reference.low_precision.RECIPES``: float8-tensorwise, float8-rowwise, mxfp8) for the
    linear layers of the blocks (attention and MLP projections): their three GEMMs consume operands cast by it,
    every amax the whole logical tensor's (``reference.low_precision.convert``); the embedding, the norms and the LM
    head, the parameters, gradients and optimizer state stay in the spec's dtype (float32). None: no recipe. Held
    precision-matched (``harness.stack.mixed``) and by counting the float8 casts the step ran
    (``harness.stack.casts``)."""
    lr_schedule: LRSchedule | None = None
    """The learning rate of each update (``reference.zero.lr_schedule``: a factor of the optimizer's lr by the updates
    already taken — warmup, a stable peak, a linear or cosine decay); None: the optimizer's lr throughout. Each stack
    runs it with its own scheduler, in its own convention, stepped once per applied update."""

    def __post_init__(self):
        if self.low_precision is not None:
            from reference.low_precision import RECIPES

            if self.low_precision not in RECIPES:
                raise ValueError(f"low_precision must be one of {', '.join(RECIPES)} or None; got "
                                 f"{self.low_precision!r}.")
        if not isinstance(self.optimizer, OptimizerSpec):
            raise ValueError(f"optimizer must be a reference.zero.OptimizerSpec; got {self.optimizer!r}.")
        if not isinstance(self.growth_interval, int) or self.growth_interval < 1:
            raise ValueError(f"growth_interval must be a whole number >= 1; got {self.growth_interval!r}.")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:  # NaN fails the comparison too
            raise ValueError(f"max_grad_norm must be a number > 0 (inf: the norm computed, nothing clipped) or None; "
                             f"got {self.max_grad_norm!r}.")
        if self.loss_scale is not None and not 0 < self.loss_scale < float("inf"):
            raise ValueError(f"loss_scale must be a finite number > 0 or None; got {self.loss_scale!r}.")
        if self.norm_type not in (2.0, float("inf")):
            raise ValueError(f"norm_type must be 2 or inf; got {self.norm_type}.")
        if not isinstance(self.accumulation, int) or self.accumulation < 1:
            raise ValueError(f"accumulation must be a whole number >= 1; got {self.accumulation!r}.")
        if self.lr_schedule is not None and not isinstance(self.lr_schedule, LRSchedule):
            raise ValueError(f"lr_schedule must be a reference.zero.LRSchedule or None; got {self.lr_schedule!r}.")


@runtime_checkable
class Stack(Protocol):
    def build(self, spec: ModelSpec, layout: Layout, recipe: Recipe, group=None) -> StackTrainer:
        """This rank's part of the trainer (called on every rank of ``group``, the default group when None,
        whose size is ``layout.world_size``). Raise ``Unsupported`` (one sentence) for a family, a spec
        field, a layout or a recipe the stack does not provide; ValueError (one sentence) for one that
        cannot run (a tp that does not divide the heads)."""


@runtime_checkable
class StackTrainer(Protocol):
    def load_dense(self, state: dict) -> None:
        """Load the one-device model's ``state_dict`` (our names; the tied head's weight under both names
        where tied) into this rank's shards."""

    def step(self, tokens, targets) -> float:
        """One optimizer step on the global batch (every rank is given the same (rows, seq) tokens and
        targets; the stack takes what its coordinates need — its batch slicing is under test too). The
        loss is the mean cross-entropy over every token of the batch; returns it, on every rank."""

    def dense_state(self) -> dict:
        """{"params": {name: full tensor}, "optimizer": {name: {state key: full tensor}} with
        ``OptimizerSpec.state_keys``, "grad_norm": the last step's global norm before clipping (None
        without clipping)} — on every rank, under the one-device model's names. A bfloat16 / float16 spec
        reports its fp32 master weights as "params" (the training state; the low-precision copy is the
        master rounded)."""


__all__ = ["LRSchedule", "Layout", "ModelSpec", "Recipe", "SCHEDULES", "Stack", "StackTrainer"]
