"""Planted bugs behind the stack contract, loaded by spec like a user's stack."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from harness.adapters.reference.stack import ReferenceStack, ReferenceStackTrainer
from harness.stack.inputs import IGNORE
from reference.zero import OptimizerSpec, Scheduled


class _KVNotSummed(ReferenceStackTrainer):
    def _build(self, model):
        from reference.models.sharding import ParallelGQAttention

        trainer = super()._build(model)
        for mod in trainer.local.modules():
            if isinstance(mod, ParallelGQAttention) and mod.replicas > 1:
                mod._kv_weight = lambda lin: lin.weight  # each replica keeps only its own query heads' share
        return trainer


class KVReplicasNotSummed(ReferenceStack):
    """Planted bug: a KV head replicated over tp / kv_heads ranks keeps each replica's own gradient (the
    share of its query heads) instead of their sum — the classic silent GQA bug under TP."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)  # the same refusals
        return _KVNotSummed(spec, layout, recipe)


class _ForgetsMomentum(ReferenceStackTrainer):
    def load(self, directory) -> None:
        super().load(directory)
        self.trainer.optimizer.state.clear()  # resumed parameters, a fresh optimizer


class ResumeForgetsMomentum(ReferenceStack):
    """Planted bug: resume restores the parameters but not the optimizer state (SGD's momentum restarts)."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _ForgetsMomentum(spec, layout, recipe)


class _RestartsSchedule(ReferenceStackTrainer):
    def load(self, directory) -> None:
        super().load(directory)
        self.trainer.lr.taken = 0  # the parameters and optimizer state restored; the scheduler built anew


class ResumeRestartsSchedule(ReferenceStack):
    """Planted bug: resume restores the parameters and optimizer state but not the learning-rate scheduler's position
    (a scheduler rebuilt at load, its state not in the checkpoint): the warmup starts over."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _RestartsSchedule(spec, layout, recipe)


class _SumsReplicas(ReferenceStackTrainer):
    def _build(self, model):
        trainer = super()._build(model)
        sync, dp = trainer.sync, self.layout.dp
        if hasattr(sync, "reduce"):  # mixed precision's reduction
            reduce = sync.reduce

            def summed():  # the DP reduction sums the replicas' gradients and forgets to divide by dp
                reduce()
                for g in sync.grads:
                    g.mul_(dp)
            sync.reduce = summed
        else:  # a float32 model's (NaiveDataParallel: all-reduce, then / dp)
            finish = sync.finish

            def summed_full():
                finish()
                for p in sync.module.parameters():
                    if p.grad is not None:
                        p.grad.mul_(dp)
            sync.finish = summed_full
        return trainer


class MixedMissingAverage(ReferenceStack):
    """Planted bug: in mixed precision (or under a float8 recipe) the DP reduction sums the replicas' gradients (no
    average)."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _SumsReplicas(spec, layout, recipe)


class _UpdateInBf16(ReferenceStackTrainer):
    def _build(self, model):
        trainer = super()._build(model)
        opt = trainer.sync.optimizer
        step = opt.step

        def rounded(*args, **kwargs):  # each master moves by its update rounded to bfloat16
            params = [p for group in opt.param_groups for p in group["params"]]
            before = [p.detach().clone() for p in params]
            out = step(*args, **kwargs)
            with torch.no_grad():
                for p, b in zip(params, before, strict=True):
                    p.copy_(b - (b - p).bfloat16().float())
            return out
        opt.step = rounded
        return trainer


class AdamUpdateInBf16(ReferenceStack):
    """Planted bug: bf16 with fp32 masters, each master moved by its optimizer update rounded to bfloat16 (the step's
    arithmetic in the model's precision): off by up to half a bf16 unit of the update. No bound on the masters sees it
    — with Adam's default eps the reference itself sits 194 E_T off one device at step 1 (a gradient element near 0
    flips its update's sign), this plant 214 —; the replay of Adam's step (harness/stack/adam_replay.py) does,
    1,600 x fp32's rounding of it."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _UpdateInBf16(spec, layout, recipe)


class _HighPrecision(ReferenceStackTrainer):
    def _build(self, model):
        import dataclasses

        recipe, self.recipe = self.recipe, dataclasses.replace(self.recipe, low_precision=None)
        try:
            return super()._build(model)  # the linear layers left in float32
        finally:
            self.recipe = recipe


class Float8NotApplied(ReferenceStack):
    """Planted bug: asked for a float8 recipe, the stack computes its linear layers in float32 (torchtitan #3123's
    kind: the recipe silently not applied). Its masters are closer to exact arithmetic than one device's float8
    run — within the precision-matched bound — so only the count of float8 casts sees it."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _HighPrecision(spec, layout, recipe)


class _ShardOnlyAttention(ReferenceStackTrainer):
    def _build(self, model):
        from reference.models.sharding import ParallelGQAttention

        trainer = super()._build(model)
        for mod in trainer.local.modules():
            if isinstance(mod, ParallelGQAttention):
                mod.core = None  # each rank attends over its own shard only, at its shard's positions
        return trainer


class CPAttendsOverItsShardOnly(ReferenceStack):
    """Planted bug: under context parallelism each rank attends over its own tokens only (no ring)."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _ShardOnlyAttention(spec, layout, recipe)


class _NotReducedOverCP(ReferenceStackTrainer):
    def _build(self, model):
        groups = dict(self.groups)
        groups.pop("dp_cp", None)  # gradients reduced over dp only: each cp rank steps on its shard's gradient
        self.groups = groups
        return super()._build(model)


class CPGradientsNotReduced(ReferenceStack):
    """Planted bug: parameters replicated over cp, their gradients reduced over dp only."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _NotReducedOverCP(spec, layout, recipe)


class _MoEPlanted(ReferenceStackTrainer):
    bug = ""

    def _build(self, model):
        trainer = super()._build(model)
        if self.bug == "divided_by_edp":  # the expert sum / (dp cp / ep) instead of / (dp cp): ep x too large
            finish, experts, ep = trainer.expert_sync.finish, trainer.experts, self.layout.ep

            def finish_without_the_ep():
                for p in experts:
                    p.grad.mul_(ep)
                finish()
            trainer.expert_sync.finish = finish_without_the_ep
        elif self.bug == "over_whole_group":  # experts reduced over dp x cp: other experts' gradients added in
            trainer.expert_sync.group = trainer.dp_group
        for moe in trainer.moe:
            if self.bug == "aux_per_shard":
                moe.planted["aux_per_shard"] = True
            elif self.bug == "aux_not_in_backward":  # the loss reports the balance loss; its gradient is dropped
                forward = moe.forward
                moe.forward = lambda x, forward=forward, moe=moe: (setattr(moe, "aux_weight", 0.0), forward(x))[1]
        return trainer


def _moe_planted(bug: str, doc: str):
    trainer = type(f"_MoE_{bug}", (_MoEPlanted,), {"bug": bug})

    class Planted(ReferenceStack):
        __doc__ = doc

        def build(self, spec, layout, recipe, group=None):
            super().build(spec, layout, recipe, group)
            return trainer(spec, layout, recipe)
    return Planted


MoEExpertsDividedByEDP = _moe_planted("divided_by_edp", "Planted bug: expert gradients divided by the expert-data-"
                                      "parallel size, not the whole data-parallel size (pytorch #160285's 2x at ep 2).")
MoEExpertsOverWholeGroup = _moe_planted("over_whole_group", "Planted bug: expert gradients reduced over the whole "
                                        "data x context group (each slot adds other experts' gradients).")
MoEAuxPerShard = _moe_planted("aux_per_shard", "Planted bug: under cp, each rank's balance loss over its own shard of "
                              "a sequence (its counts and probabilities never summed over cp).")
MoEAuxNotInBackward = _moe_planted("aux_not_in_backward", "Planted bug: the balance loss is reported but never back-"
                                   "propagated (the router's gradient misses it; the loss looks right).")


class _TitanExpertsDoubled:
    """Mixed into torchtitan's MoE trainer: under EP every routed expert's gradient doubled after each backward."""

    def _forward_backward(self, parts, tokens, targets, global_tokens) -> float:
        loss = super()._forward_backward(parts, tokens, targets, global_tokens)
        for part in parts:
            for name, p in part.named_parameters():
                if self.layout.ep > 1 and "inner_experts" in name and p.grad is not None:
                    p.grad.mul_(2)
        return loss


class TitanExpertsDoubled:
    """Planted bug in torchtitan's MoE stack: every expert gradient 2x — pytorch #160285's symptom at EP = 2
    ("loss curves are equivalent even with the doubled gradients")."""

    def build(self, spec, layout, recipe, group=None):
        from harness.adapters.torchtitan.stack import TorchtitanStack, TorchtitanStackTrainer

        TorchtitanStack().build(spec, layout, recipe)  # the same refusals
        return type("Doubled", (_TitanExpertsDoubled, TorchtitanStackTrainer), {})(spec, layout, recipe)


class _MeanPerMicroBatch(ReferenceStackTrainer):
    def _build(self, model):
        trainer = super()._build(model)
        passes = trainer.schedule.num_microbatches * self.recipe.accumulation

        def mean_then_averaged(summed, target, share):  # each micro-batch's own mean, averaged over them
            return summed / (target != IGNORE).sum() / passes
        trainer.normalise = mean_then_averaged
        return trainer


class MeanPerMicroBatch(ReferenceStack):
    """Planted bug: each micro-batch's loss is the mean over its own counted targets, and the micro-batches'
    gradients are averaged — the accumulation bug of recent years; equal to the global mean on full batches."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _MeanPerMicroBatch(spec, layout, recipe)


class _MeanPerRank(ReferenceStackTrainer):
    def step(self, tokens, targets):
        dp = self.layout.dp
        per = len(targets) // dp
        counts = [(targets[i * per:(i + 1) * per] != IGNORE).sum() for i in range(dp)]
        mine = counts[self.trainer.coords.dp] / self.layout.cp  # this replica's own count, shared by its cp ranks
        self.trainer.normalise = lambda summed, target, share: summed / mine
        return super().step(tokens, targets)


class MeanPerRank(ReferenceStack):
    """Planted bug: each replica's loss is the mean over its own counted targets, and the replicas' gradients are
    averaged (DDP's average of per-rank means); equal to the global mean on full batches."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _MeanPerRank(spec, layout, recipe)


class _CountsReplicatedTpTimes(ReferenceStackTrainer):
    def _build(self, model):
        import torch

        trainer = super()._build(model)
        params, kwargs = trainer._norm_args  # every element counted on every TP rank (replicated ones too)
        trainer._norm_args = (params, {**kwargs, "tp_sharded": params,
                                       "counted": {id(p): torch.ones_like(p, dtype=torch.bool) for p in params}})
        return trainer


class ReplicatedCountedTpTimes(ReferenceStack):
    """Planted bug (TransformerEngine PR 715): parameters replicated over TP counted in the clipping norm on every
    TP rank."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _CountsReplicatedTpTimes(spec, layout, recipe)


class _LeavesPpOut(ReferenceStackTrainer):
    def _build(self, model):
        trainer = super()._build(model)
        trainer.clip_groups = {k: g for k, g in trainer.groups.items() if k != "pp"}  # each stage its own norm
        return trainer


class PpNotReduced(ReferenceStack):
    """Planted bug (torchtitan #596): each pipeline stage clips by its own norm (the norm not reduced over pp)."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _LeavesPpOut(spec, layout, recipe)


class _TiedNotSummed(ReferenceStackTrainer):
    def _build(self, model):
        trainer = super()._build(model)
        trainer._sum_tied = lambda: None  # the embedding's and the head's copies keep their own gradients
        return trainer


class TiedNotSummed(ReferenceStack):
    """Planted bug: a tied embedding whose two copies (first and last stage) never sum their gradients."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _TiedNotSummed(spec, layout, recipe)


class _LastRankRaises(ReferenceStackTrainer):
    def step(self, tokens, targets):
        import torch.distributed as dist

        if dist.get_rank() == dist.get_world_size() - 1:
            raise RuntimeError(f"sequence length {tokens.shape[-1]} not supported on the last rank")
        return super().step(tokens, targets)


class LastRankRaises(ReferenceStack):
    """Planted bug: the step raises on the last rank only, its peers blocked inside their own steps."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _LastRankRaises(spec, layout, recipe)


class _MuonOnLocalRows(ReferenceStackTrainer):
    def _build(self, model):
        trainer = super()._build(model)
        getattr(trainer.reduction.optimizer.matrices, "shards", {}).clear()  # each TP rank orthogonalises its block
        return trainer


class MuonOnLocalRows(ReferenceStack):
    """Planted bug: Muon's Newton-Schulz on each tensor-parallel rank's own rows (or columns) of a split matrix, not
    the whole — the bug a sharded Muon is held against (Megatron-LM #5961's question)."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _MuonOnLocalRows(spec, layout, recipe)


class _RangeOnly:
    """A flat buffer whose gather keeps this rank's range and zeros for the others' (no communication)."""

    def __init__(self, flat):
        self.flat = flat

    def __getattr__(self, name):
        return getattr(self.flat, name)

    def gather(self, shard, out=None):
        full = torch.zeros_like(self.flat.buffer)
        full[self.flat.shard] = shard
        return full


class _MuonOnFlatRange(ReferenceStackTrainer):
    def _build(self, model):
        trainer = super()._build(model)
        if trainer.zero_stage:  # ZeRO 1/2's flat Muon (reference.muon.flat); ZeRO 0 as the reference
            muon = trainer.reduction.sync.optimizer
            muon.flat = _RangeOnly(muon.flat)
        return trainer


class MuonOnFlatRange(ReferenceStack):
    """Planted bug: Muon at ZeRO 1/2 orthogonalising each matrix from the rank's own range of the flat shard (the
    other ranks' elements zero) — a ZeRO shard's Newton-Schulz without the gather (DeepSpeed's flat partitions)."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _MuonOnFlatRange(spec, layout, recipe)


class _NoReplicaReduction(ReferenceStackTrainer):
    def _build(self, model):
        trainer = super()._build(model)
        trainer.reduction.sync.flat.replicas = 1  # each replica's shard reduced within its shard group only
        return trainer


class HybridNoReplicaReduction(ReferenceStack):
    """Planted bug: hybrid sharding whose shards are never all-reduced across the replicas — each replica trains on
    its own rows (the "hybrid" that silently stops synchronising: pytorch #154888's (n, 1) mesh, verl #7493)."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _NoReplicaReduction(spec, layout, recipe)


class _TorchPolicy:
    """The torch stack asked for selective checkpointing, building another policy (every other layout as asked)."""

    policy: str | None = None

    def build(self, spec, layout, recipe, group=None):
        from dataclasses import replace

        from harness.adapters.torch.stack import TorchStack

        if layout.checkpoint_policy == "selective":
            layout = replace(layout, checkpointing=self.policy is not None, checkpoint_policy=self.policy or "full")
        return TorchStack().build(spec, layout, recipe, group)


class SelectiveIgnored(_TorchPolicy):
    """Planted bug: selective checkpointing asked, nothing checkpointed (TRL PR 6280's review: a policy silently not
    applied) — the same gradients."""

    policy = None


class SelectiveSavesNoMatmul(_TorchPolicy):
    """Planted bug: selective checkpointing asked, every block recomputed whole (the policy's save list ignored)."""

    policy = "full"


class TiedAfterFullyShard:
    """Planted bug: the torch stack's tied embedding re-tied after ``fully_shard`` (torchtitan's order: its
    ``init_weights`` after parallelize) — FSDP2 manages the embedding's and the head's parameter apart, the module
    shares one: right at step 1, off from step 2."""

    def build(self, spec, layout, recipe, group=None):
        from harness.adapters.torch.stack import TorchStack
        from harness.adapters.torch.stack_trainer import Torch3D

        trainer = TorchStack().build(spec, layout, recipe, group)
        trainer.three_d = type("TiesAfterFsdp", (Torch3D,), {"tie_after_fsdp": True})
        return trainer


class DDPDividesByDpTwice:
    """Planted bug: the torch stack's DDP (ZeRO 0 / 1 over replicas) with each replica's summed loss divided by the
    global batch's count of targets while DDP averages the gradients over dp as well — every gradient / dp
    (torchtitan 0.2's DDP finding, as a torch user writes it)."""

    def build(self, spec, layout, recipe, group=None):
        from harness.adapters.torch.stack import TorchStack
        from harness.adapters.torch.stack_trainer import Torch3D

        trainer = TorchStack().build(spec, layout, recipe, group)
        trainer.three_d = type("DividesTwice", (Torch3D,), {"loss_over_global_count": True})
        return trainer


class SequenceParallelNormsApart:
    """Planted bug: the torch stack's sequence parallelism with the norms left out of the plan — each TP rank's norm
    weights step with the gradient of its own share of the sequence, never summed over the TP group (Megatron's
    norms without their all-reduce): the norms off from step 1, each TP rank's apart."""

    def build(self, spec, layout, recipe, group=None):
        from harness.adapters.torch.stack import TorchStack
        from harness.adapters.torch.stack_trainer import Torch3D

        trainer = TorchStack().build(spec, layout, recipe, group)
        trainer.three_d = type("NormsApart", (Torch3D,), {"sequence_parallel_norms": False})
        return trainer


class DecaysEveryParameter(ReferenceStack):
    """Planted bug: AdamW decays every parameter where the rule spares the biases and norms — one parameter group (a
    torchtitan config without its no-decay pattern, megatron-core's optimizer stepped without Megatron-LM's
    scheduler)."""

    def build(self, spec, layout, recipe, group=None):
        if recipe.optimizer.name == "adamw":
            recipe = replace(recipe, optimizer=replace(recipe.optimizer, decay="all"))
        return super().build(spec, layout, recipe, group)


@dataclass(frozen=True)
class _L2(OptimizerSpec):
    def build(self, params, masks=None):
        if self.name != "adamw":
            return super().build(params, masks)
        # Adam's weight_decay: L2, wd x p added to the gradient before the moments — not AdamW's decoupled decay
        return torch.optim.Adam(self.param_groups(params), lr=self.lr, betas=self.betas, eps=self.eps,
                                weight_decay=self.weight_decay)


class CoupledWeightDecay(ReferenceStack):
    """Planted bug: AdamW's weight decay coupled into the gradient (L2, torch's Adam with weight_decay; DeepSpeed's
    FusedAdam with adam_w_mode False) — the update then normalises the decay away by sqrt(v)."""

    def build(self, spec, layout, recipe, group=None):
        opt = recipe.optimizer
        return super().build(spec, layout, replace(recipe, optimizer=_L2(**{f.name: getattr(opt, f.name)
                                                                            for f in fields(opt)})), group)


class _MisScheduled(Scheduled):
    """A scheduler stepped wrongly: ``ahead`` updates early, ``per_update`` positions per update, or only the first
    parameter group's lr set."""

    def __init__(self, schedule, ahead: int = 0, per_update: int = 1, first_group_only: bool = False,
                 adamw_half_only: bool = False):
        super().__init__(schedule)
        self.taken, self.per_update = ahead, per_update
        self.first_group_only, self.adamw_half_only = first_group_only, adamw_half_only

    def before_update(self, optimizers) -> None:
        if self.first_group_only:
            optimizers = [_FirstGroup(opt) for opt in optimizers]
        if self.adamw_half_only:
            optimizers = [_AdamWHalf(opt) for opt in optimizers]
        super().before_update(optimizers)

    def after_update(self) -> None:
        self.taken += self.per_update


class _FirstGroup:
    def __init__(self, opt):
        self.param_groups = opt.param_groups[:1]


class _AdamWHalf:
    """A Muon optimizer's groups but its matrices' (``MuonAdamW``: its ``matrices`` optimizer's; ``FlatMuon``: its
    first group): what a scheduler built over the AdamW of a torch user's two optimizers sets."""

    def __init__(self, opt):
        from reference.muon.flat import FlatMuon

        matrices = getattr(opt, "matrices", None)
        muon = matrices.param_groups if matrices is not None else opt.param_groups[:1] \
            if isinstance(opt, FlatMuon) else []
        self.param_groups = [g for g in opt.param_groups if not any(g is m for m in muon)]


class _ScheduleBug(ReferenceStack):
    bug: dict = {}

    def build(self, spec, layout, recipe, group=None):
        trainer = super().build(spec, layout, recipe, group)
        built = trainer._build
        bug = dict(self.bug)
        if bug.get("per_update") == "accumulation":
            bug["per_update"] = recipe.accumulation

        def _build(model):
            t = built(model)
            t.lr = _MisScheduled(recipe.lr_schedule, **bug)
            return t

        trainer._build = _build
        return trainer


class ScheduleStepsPerMicroBatch(_ScheduleBug):
    """Planted bug: the learning-rate scheduler stepped once per accumulation micro-step (inside the loop, as a
    per-batch scheduler is) — the schedule runs that many times as fast."""

    bug = {"per_update": "accumulation"}


class ScheduleOneAhead(_ScheduleBug):
    """Planted bug: the scheduler stepped before the optimizer (torch warns of it; a loop that steps it first) — every
    update at the next update's learning rate."""

    bug = {"ahead": 1}


class ScheduleFirstGroupOnly(_ScheduleBug):
    """Planted bug: a scheduler that sets only the first parameter group's lr — AdamW's no-decay group (the biases and
    norms) trains at the peak throughout."""

    bug = {"first_group_only": True}


class ScheduleSkipsMuon(_ScheduleBug):
    """Planted bug: Muon's matrices and its AdamW as a torch user's two optimizers, the scheduler built over the AdamW
    one — the hidden matrices train at the peak lr throughout, the embedding, head and vectors on the schedule."""

    bug = {"adamw_half_only": True}


class _ScalerPlanted:
    """The torch stack in float16 with ``scaler`` (a subclass of ``torch.amp.GradScaler``) as its loss scaler."""

    scaler: type = torch.amp.GradScaler

    def build(self, spec, layout, recipe, group=None):
        from harness.adapters.torch.stack import TorchStack

        trainer = TorchStack().build(spec, layout, recipe, group)
        trainer.scaler_class = self.scaler
        return trainer


class _StepsThroughInf(torch.amp.GradScaler):
    def step(self, optimizer, *args, **kwargs):
        return optimizer.step()  # the inf check recorded by unscale_, then ignored


class _ClipsScaled(torch.amp.GradScaler):
    def unscale_(self, optimizer):
        pass  # the stack's unscale_ before clipping does nothing: the gradients are clipped scaled

    def step(self, optimizer, *args, **kwargs):
        super().unscale_(optimizer)
        return super().step(optimizer, *args, **kwargs)


class Fp16StepsThroughInf(_ScalerPlanted):
    """Planted bug: fp16 whose optimizer steps through an overflow (the scaler's skip ignored: the update of an
    inf gradient applied, the scale backed off all the same)."""

    scaler = _StepsThroughInf


class Fp16ClipsScaledGradients(_ScalerPlanted):
    """Planted bug: fp16 whose gradients are clipped while still multiplied by the loss scale (unscaled after the
    clip): the clip takes the scaled norm, every update ~scale x too small."""

    scaler = _ClipsScaled
