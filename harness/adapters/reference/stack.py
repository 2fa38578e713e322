"""The ``reference`` stack: ``reference.stack.compose.Parallel3D`` under the stack contract — both families
(GPT, Llama), dp x pp x tp (x cp for the Llama: ring attention over zigzag sequence shards), ZeRO 0-2,
the three schedules, activation checkpointing, clipping,
accumulation, bf16 / fp16 with fp32 masters and a loss scaler; ``save`` / ``load`` through
``reference.resume`` (any layout from any other).

Its dense state is assembled from what each rank holds, named as one device names it
(``reference.resume.threed.rank_shards``: each rank's data-parallel range of its tensor-parallel boxes):
every rank gathers every rank's boxes and writes them into the dense tensors — so what comes back is
exactly what the ranks hold, replicas and all.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.contracts import Unsupported
from harness.stack.built import BuiltFromDense
from harness.stack.dense import others_then_mine
from harness.stack.supports import Rule, Supports, always

_GROUPS: dict = {}


def _raised(check):
    """The sentence a reference check raises (its ValueError) for the case, or None."""
    def why(spec, layout, recipe):
        try:
            check(spec, layout)
        except ValueError as exc:
            return str(exc)
        return None
    return why


def _experts_split(spec, layout) -> None:
    from reference.expert_parallel.moe import check_split

    check_split(spec.experts, layout.ep)  # what StackMoE would refuse at load_dense, refused here


def _heads_split(spec, layout) -> None:
    from reference.models.sharding import check_heads

    check_heads(spec.heads, spec.kv, layout.tp)  # what the split would refuse, refused here


def _chunks(layout) -> int:
    return layout.pp * (2 if layout.schedule == "interleaved" else 1)


SUPPORTS = Supports("the reference stack", unsupported=(
    Rule(lambda s, lay, r: lay.sequence_parallel,
         "the reference stack has no sequence parallelism (Megatron's split of the activations inside a TP group)."),
    Rule(lambda s, lay, r: lay.zero == 3,
         "the reference stack shards up to ZeRO 2 (optimizer state and gradients) with pipeline parallelism; ZeRO 3 "
         "is not composed."),
    Rule(lambda s, lay, r: r.low_precision and lay.cp > 1,
         "the reference stack's float8 recipe runs without context parallelism (a CP shard's activations would need "
         "their amaxes reduced over the CP group, which its ring attention's projections do not do)."),
    Rule(lambda s, lay, r: r.low_precision and (s.family == "moe" or s.dtype != "float32"),
         "the reference stack's float8 / MX recipe converts the dense linear layers of a float32 GPT or Llama."),
    Rule(lambda s, lay, r: lay.cp > 1 and s.family not in ("llama", "moe"),
         lambda s, lay, r: "the reference stack's context parallelism splits the Llama family's attention (grouped-"
                           f"query heads, rotary positions), not the {s.family} family's."),
    Rule(lambda s, lay, r: r.optimizer.name == "muon" and (s.family == "moe" or r.low_precision
                                                          or s.dtype not in ("float32", "float64")),
         "the reference stack's Muon (each matrix gathered whole over TP, and at ZeRO 1-2 over the flat shards) "
         "trains the dense families in float32 / float64; its experts, float8 and mixed precision are not composed "
         "with it."),
    Rule(lambda s, lay, r: lay.replicate > 1 and lay.ep > 1,
         "the reference stack shards hybrid (replicate x shard) the dense parameters; its experts' sharding over "
         "their expert-data-parallel group is not composed with replicas."),
), optimizers=("sgd", "adam", "adamw", "muon"), hybrid=True, schedules=True, refused=(
    Rule(lambda s, lay, r: lay.ep > 1 and s.family != "moe",
         lambda s, lay, r: f"ep ({lay.ep}) splits experts: the {s.family} family has none (the moe family has)."),
    Rule(lambda s, lay, r: lay.ep > 1, _raised(_experts_split)),
    Rule(lambda s, lay, r: s.dtype == "float16" and r.loss_scale is None,
         "a float16 model needs a loss scale (Recipe.loss_scale): its gradients underflow."),
    Rule(always, _raised(_heads_split)),
    Rule(lambda s, lay, r: _chunks(lay) > s.layers,
         lambda s, lay, r: f"pp x virtual stages = {_chunks(lay)} cannot exceed the number of layers ({s.layers})."),
))


class ReferenceStack:
    description = "ours: reference.stack.compose.Parallel3D (TP, CP, EP on MoE, pipeline, DP / ZeRO 0-2), every family"

    def build(self, spec, layout, recipe, group=None):
        if group is not None and group is not dist.group.WORLD and dist.get_world_size(group) != dist.get_world_size():
            raise Unsupported("the reference stack runs on the default group only.")
        SUPPORTS.check(spec, layout, recipe)
        return ReferenceStackTrainer(spec, layout, recipe)


class ReferenceStackTrainer(BuiltFromDense):
    def __init__(self, spec, layout, recipe):
        from reference.mixed_precision import DynamicLossScaler
        from reference.stack.topology import ParallelDims, build_groups

        self.spec, self.layout, self.recipe = spec, layout, recipe
        self.dims = ParallelDims(layout.dp, layout.pp, layout.tp, cp=layout.cp, ep=layout.ep,
                                 replicate=layout.replicate)
        self.dims.check(dist.get_world_size(), spec.heads, spec.layers)
        if self.dims not in _GROUPS:  # created once per layout and rank process (collectively, in build)
            _GROUPS[self.dims] = build_groups(self.dims, dist.get_rank())
        self.groups = _GROUPS[self.dims]
        self.scaler = (lambda: DynamicLossScaler(recipe.loss_scale, growth_interval=recipe.growth_interval)) \
            if recipe.loss_scale is not None else (lambda: None)
    def _build(self, model):
        from reference.stack.compose import parallelize

        layout, recipe = self.layout, self.recipe
        trainer = parallelize(model, self.dims, layout.schedule, layout.zero, layout.checkpointing,
                              groups=self.groups, optimizer=recipe.optimizer, microbatches=layout.num_microbatches,
                              loss_scaler=self.scaler(), max_grad_norm=recipe.max_grad_norm,
                              norm_type=recipe.norm_type, accumulation=recipe.accumulation,
                              lr_schedule=recipe.lr_schedule)
        if recipe.low_precision is not None:  # the blocks' projections (the LM head is not one of these classes)
            from reference.low_precision.convert import set_recipe
            from reference.tensor_parallel import ColumnParallelLinear, RowParallelLinear

            set_recipe(trainer.local.modules(), recipe.low_precision,
                       {ColumnParallelLinear: "column", RowParallelLinear: "row"}, self.groups["tp"])
        return trainer

    def step(self, tokens, targets) -> float:
        from harness.runtime.rank import rank_device

        return self.trainer.step(tokens.to(rank_device()), targets.to(rank_device()))

    def dense_state(self) -> dict:
        from reference.resume.threed import rank_shards

        mine = [(s.name, s.tensor.cpu(), s.offsets, s.global_shape) for s in rank_shards(self.trainer)]
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        dense: dict[str, torch.Tensor] = {}
        for shards in others_then_mine(everyone, dist.get_rank()):  # its own boxes last (harness.stack.dense)
            for name, tensor, offsets, shape in shards:
                full = dense.setdefault(name, torch.zeros(shape, dtype=tensor.dtype))
                full[tuple(slice(o, o + n) for o, n in zip(offsets, tensor.shape, strict=True))] = tensor
        params = {k.removeprefix("model/"): v for k, v in dense.items() if k.startswith("model/")}
        optimizer: dict[str, dict] = {}
        for key, value in dense.items():
            if key.startswith("optim/") and key != "optim/step":
                _, state_key, name = key.split("/", 2)
                optimizer.setdefault(name, {})[state_key] = value
        if self.spec.tie_embeddings:  # one parameter on one device: its state once, under the embedding's name
            optimizer.pop("head.weight", None)  # (the head's copy is held to it through "params")
        norm = self.trainer.last_grad_norm
        return {"params": params, "optimizer": optimizer, "grad_norm": norm}

    def traced_modules(self) -> dict:
        """{one-device module name: this rank's module} (``harness.localise``)."""
        from harness.localise.names import modules_by_parameters

        names = {id(p): name for p, name, *_ in self.traced_parameters()}
        return modules_by_parameters(self.spec, self.trainer.local, lambda p: names.get(id(p)))

    def traced_parameters(self) -> list:
        """[(parameter, one-device name, offsets, lengths, dense shape)] of this rank (``harness.localise``)."""
        from reference.resume.threed import tensor_map

        return tensor_map(self.trainer)

    def memory(self) -> dict:
        """Bytes of model state this rank holds (each storage once): parameters, gradients, optimizer state
        (in mixed precision the fp32 masters count as optimizer state: the ZeRO paper's K)."""
        from reference.zero import held_bytes
        from reference.zero.accounting import optimizer_state_tensors

        t = self.trainer
        params = list(t.local.parameters())
        if t.mixed:  # each data-parallel part's (the dense parameters', the experts')
            grads = [g for part in t.parts for g in part.sync.held_grads()]
            state = [m for part in t.parts for m in part.sync.masters]
        else:
            grads = [p.grad for p in params] + ([part.sync.master.grad for part in t.parts] if t.zero_stage else [])
            state = []
        return {"params": held_bytes(params), "grads": held_bytes(grads),
                "optimizer": held_bytes(state + [s for o in t.optimizers for s in optimizer_state_tensors(o)])}

    def pipeline_events(self) -> list:
        """(action, start, end) seconds of this rank's last pipeline pass (the bench's measured bubble)."""
        return self.trainer.last_events

    resumes_lr_schedule = True
    """``save`` / ``load`` carry the learning-rate schedule's position (the updates taken)."""

    def save(self, directory) -> None:
        from reference.resume.threed import save_3d

        save_3d(directory, "state", self.trainer, {"family": self.spec.family})

    def load(self, directory) -> None:
        from pathlib import Path

        from reference.resume.threed import load_3d

        load_3d(Path(directory) / "state", self.trainer)

