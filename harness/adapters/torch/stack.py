"""The ``torch`` stack: the torchtitan-style torch 3D stack (``harness.adapters.torch.stack_trainer.Torch3D``: DTensor
TP with torchtitan's plan per family, torch.distributed.pipelining — GPipe / 1F1B / ZB-H1 one stage a rank, interleaved
1F1B / interleaved zero bubble / ZB-V / DualPipeV two, placed as ``reference.pipeline.placement`` places them, each
stage its own FSDP2 root or DDP module —, FSDP2 over dp) under the
stack contract, for the GPT and the Llama family (grouped-query attention through the same
ColwiseParallel plan: the KV heads split over tp). Sequence parallelism is torchtitan's plan with it (``Torch3D``:
each norm ``SequenceParallel`` on the rank's share of the sequence, the attention's and the MLP's input gathered,
their output reduce-scattered back); a sequence that does not split evenly over tp is refused (the plan's local
shards are read as even ones).

Activation checkpointing is ``torch.utils.checkpoint`` (non-reentrant) around each block's forward, after TP and
before FSDP2 (torchtitan's order), "full" or "selective" (``create_selective_checkpoint_contexts``: the matmuls
saved); ``Layout.compile`` compiles each block's forward with ``torch.compile`` (inductor), checkpointing inside the
compiled region, the FSDP2 hooks outside it.

FSDP2 shards over dp: ZeRO 2 is ``reshard_after_forward=False``, 3 is True (over one replica nothing is sharded and any
stage is the same). ZeRO 0 / 1 over dp > 1 is torch's ``DistributedDataParallel`` around each stage (the parameters
plain tensors, whole on every replica; at ZeRO 1 ``ZeroRedundancyOptimizer`` over dp, each parameter's state on one
replica), as pipelining's ``PipelineStage`` supports it (``no_sync`` but for the last micro-batch; the stack's
accumulation likewise), at tp 1 only: DDP's own path for DTensor parameters (``device_mesh`` of a (dp, tp) mesh) empties
the module after its first forward (a finding: suites/tensor_parallel/test_findings.py). torch's DDP
support in pipelining has two findings (``harness.stack.findings``): it raises at step 2 where the first step ran two
of a stage's backwards in a row (GPipe; the others over no more micro-batches than stages), and the zero-bubble
schedules reduce no stage but the first.

What it does not provide is ``Unsupported`` in one sentence: ZeRO 0 / 1 over dp at tp > 1, in bf16 or hybrid, a schedule
this torch's pipelining lacks, tied embeddings over more than one stage (pipelining shares no parameter across stages;
on one stage the embedding and the head are one parameter, tied after TP and before FSDP2 groups it), kv_heads < tp
(ColwiseParallel cannot split fewer heads than ranks: they would have to be replicated, which the plan does not do —
torchtitan requires the KV heads to divide by tp too) and fp16 over pp > 1 or with Muon. bf16 is FSDP2's
``MixedPrecisionPolicy`` (torchtitan's recipe: fp32 parameters as the masters, each module computing in a bf16 copy,
gradients reduced in fp32, the cross-entropy over fp32 logits), held precision-matched; fp16 the same with
``torch.amp.GradScaler`` at the contract's ``loss_scale`` / ``growth_interval`` (the loss scaled in the schedule's
loss function, ``unscale_`` before clipping, the schedulers held still on a skipped step) — at pp 1: the scaler
reduces its inf check over no process group of its own, so pipeline stages would skip apart. Over TP, DTensor
reduces that check over the mesh dimensions on which the optimizer's first gradient is sharded (a torch finding,
suites/tensor_parallel/test_findings.py): here the first is the embedding's, sharded over dp and tp. A float8 recipe
(``Recipe.low_precision``, tensorwise or rowwise) is torchao's emulated ``Float8Linear`` in every block, MXFP8 its
emulated ``MXFP8Linear`` (the module torchtitan's MXFP8 converter builds), converted before TP (torch's
``ColwiseParallel`` / ``RowwiseParallel`` over it, as torchtitan does for rowwise), pipelining and FSDP2.

``save`` / ``load`` go through ``torch.distributed.checkpoint`` (DCP), keyed by the one-device names (each
stage's local names renamed, as torchtitan's pipeline split keeps global FQNs) so that a split that changes
with pp finds its tensors: ``model.<name>`` for a parameter, ``optim.<name>.<key>`` for each optimizer
state tensor, each the rank's DTensor — DCP reshards between placements, world sizes and stage splits.
"""

from __future__ import annotations

from harness.contracts import Unsupported
from harness.stack.built import BuiltFromDense
from harness.stack.dense import gathered, tied
from harness.stack.supports import Rule, Supports

_MESHES: dict = {}


def _muon_lacks(recipe) -> str | None:
    """Why torch's Muon cannot step ``recipe``'s (an ``adjust_lr_fn`` this torch lacks), or None."""
    from reference.muon.spec import torch_lacks

    return torch_lacks(recipe.optimizer.adjust_lr_fn)


SUPPORTS = Supports("the torch stack", unsupported=(
    Rule(lambda s, lay, r: s.family == "moe" or lay.ep > 1,
         "the torch stack here trains the gpt and llama families (torch has no mixture-of-experts layer of its own; "
         "torchtitan's is the torchtitan stack's)."),
    Rule(lambda s, lay, r: lay.cp > 1,
         "the torch stack has no context parallelism here (torch's context_parallel cannot run on a CPU: "
         "suites/context_parallel/test_third_party.py)."),
    Rule(lambda s, lay, r: _ddp(lay) and lay.tp > 1,
         lambda s, lay, r: f"the torch stack's ZeRO {lay.zero} over dp is DDP at tp 1: DDP's own path for "
                           "tensor-parallel (DTensor) parameters, device_mesh of a (dp, tp) mesh, leaves the module "
                           "without parameters after its first forward (a torch finding: suites/tensor_parallel/"
                           "test_findings.py); its ZeRO 2 / 3 are FSDP2 under TP, and torchtitan replicates as FSDP2 "
                           "over a (dp, 1) mesh."),
    Rule(lambda s, lay, r: _ddp(lay) and lay.replicate > 1,
         "the torch stack's ZeRO 1 is torch's ZeroRedundancyOptimizer over one replica group: hybrid sharding is "
         "FSDP2's (ZeRO 2 / 3)."),
    Rule(lambda s, lay, r: _ddp(lay) and s.dtype not in ("float64", "float32"),
         lambda s, lay, r: f"the torch stack's ZeRO {lay.zero} over dp is DDP, whose mixed precision is private "
                           f"(_MixedPrecision); {s.dtype} is FSDP2's MixedPrecisionPolicy here (ZeRO 2 / 3)."),
    Rule(lambda s, lay, r: _ddp(lay) and lay.zero == 1 and r.optimizer.name == "muon",
         "torch's ZeroRedundancyOptimizer steps each rank's whole parameters with one optimizer class: Muon with its "
         "AdamW half is not composed with it here."),
    Rule(lambda s, lay, r: _lacks(lay.schedule) is not None, lambda s, lay, r: _lacks(lay.schedule)),
    Rule(lambda s, lay, r: bool(s.dropout),
         "the torch stack trains without dropout: the one-device masks are keyed by each row's global index and the "
         "step, which its pipelining schedules do not pass to the stages."),
    Rule(lambda s, lay, r: s.tie_embeddings and lay.stages > 1,
         lambda s, lay, r: f"the torch stack cannot tie the embedding to the LM head over {lay.stages} pipeline "
                           "stages: torch.distributed.pipelining has no parameter shared across stages."),
    Rule(lambda s, lay, r: s.kv % lay.tp,
         lambda s, lay, r: f"the torch stack splits the {s.kv} KV heads over tp = {lay.tp} with ColwiseParallel; fewer "
                           "KV heads than ranks would have to be replicated, which its plan does not do."),
    Rule(lambda s, lay, r: r.low_precision and not _has_torchao(),
         "the torch stack trains a float8 recipe through torchao, which is not installed (pip install "
         "'paritybench[torchao]')."),
    Rule(lambda s, lay, r: r.low_precision and s.dtype != "float32",
         "the torch stack's float8 recipe converts the linear layers of a float32 model (torchao's Float8Linear)."),
    Rule(lambda s, lay, r: s.dtype not in ("float64", "float32", "bfloat16", "float16"),
         lambda s, lay, r: f"the torch stack trains float64, float32, and bf16 / fp16 through FSDP2's "
                           f"MixedPrecisionPolicy (fp32 masters), not {s.dtype}."),
    Rule(lambda s, lay, r: s.dtype == "float16" and r.loss_scale is None,
         "a float16 model needs a loss scale (Recipe.loss_scale): its gradients underflow."),
    Rule(lambda s, lay, r: s.dtype == "float16" and r.optimizer.name == "muon",
         "torch's GradScaler unscales and steps one torch optimizer; Muon here is torch's Muon and its AdamW, two."),
    Rule(lambda s, lay, r: s.dtype == "float16" and lay.pp > 1,
         "torch's GradScaler judges the gradients of the optimizer it is given and reduces its inf check over no "
         "process group of its own: each pipeline stage would skip an overflowing step alone (fp16 at pp 1 here)."),
    Rule(lambda s, lay, r: r.optimizer.name == "muon" and r.low_precision,
         "the torch stack trains Muon without a float8 recipe here."),
    Rule(lambda s, lay, r: r.optimizer.name == "muon" and _muon_lacks(r) is not None,
         lambda s, lay, r: _muon_lacks(r)),
), optimizers=("sgd", "adam", "adamw", "muon"), hybrid=True, selective=True, compiles=True, schedules=True,
    refused=(
    Rule(lambda s, lay, r: s.heads % lay.tp,
         lambda s, lay, r: f"tp ({lay.tp}) must divide the attention heads ({s.heads})."),
    Rule(lambda s, lay, r: lay.stages > s.layers,
         lambda s, lay, r: f"the {lay.stages} pipeline stages (pp = {lay.pp} under {lay.schedule}) cannot exceed the "
                           f"number of layers ({s.layers})."),
))


def _ddp(layout) -> bool:
    """ZeRO 0 / 1 over more than one replica: the torch stack's DDP (+ ZeroRedundancyOptimizer)."""
    return layout.dp > 1 and layout.zero < 2


def _lacks(schedule: str) -> str | None:
    from harness.adapters.torch.stack_trainer import lacks

    return lacks(schedule)


def _has_torchao() -> bool:
    import importlib.util

    return importlib.util.find_spec("torchao") is not None


class TorchStack:
    description = "torchtitan-style: DTensor TP + pipelining (GPipe, 1F1B) + FSDP2, GPT and Llama"

    def build(self, spec, layout, recipe, group=None):
        SUPPORTS.check(spec, layout, recipe)
        return TorchStackTrainer(spec, layout, recipe)


class ReshardToPairs(TorchStack):
    description = ("FSDP2 at ZeRO 3 resharding after forward to groups of 2 ranks (reshard_after_forward=2: the "
                   "backward's all-gathers within each pair, ZeRO++ hpZ's idea in torch)")

    def build(self, spec, layout, recipe, group=None):
        shard = layout.dp // layout.replicate  # FSDP2's shard dimension
        if layout.zero != 3 or shard <= 2 or shard % 2:
            raise Unsupported(f"FSDP2's reshard_after_forward=2 reshards ZeRO 3's parameters to a non-trivial divisor "
                              f"of the shard group's size (here ZeRO {layout.zero} over {shard} ranks).")
        if layout.tp > 1:  # watch: suites/stack/test_hybrid.py::test_watch_fsdp2_reshards_no_dtensor_to_a_smaller_group
            raise Unsupported("FSDP2 does not reshard tensor-parallel (DTensor) parameters to a smaller group "
                              "(\"Resharding to smaller mesh is not supported for DTensor parameters yet\").")
        SUPPORTS.check(spec, layout, recipe)
        return TorchStackTrainer(spec, layout, recipe, reshard_after_forward=2)


class CpuOffload(TorchStack):
    description = ("FSDP2 with CPUOffloadPolicy: the sharded parameters, their gradients and the optimizer's step on "
                   "the host (pinned where the machine pins), under TP and pipelining as without")

    def build(self, spec, layout, recipe, group=None):
        if _ddp(layout):
            raise Unsupported(f"FSDP2's CPUOffloadPolicy offloads sharded state; the torch stack's ZeRO {layout.zero} "
                              "over dp is DDP's, on the device.")
        SUPPORTS.check(spec, layout, recipe)
        return TorchStackTrainer(spec, layout, recipe, offload=True)


class TorchStackTrainer(BuiltFromDense):
    three_d = None
    """The ``Torch3D`` class it builds (None: ``Torch3D``; a planted bug's subclass in ``suites.stack.planted``)."""
    scaler_class = None
    """fp16's loss scaler class (None: ``torch.amp.GradScaler``; a planted bug's subclass: ``suites.stack.planted``)."""

    def __init__(self, spec, layout, recipe, reshard_after_forward: bool | int | None = None, offload: bool = False):
        """``reshard_after_forward``: FSDP2's (None: ZeRO 3's True, ZeRO 2's False; an int: the group size it
        reshards to after forward, ``ReshardToPairs``). ``offload``: FSDP2's CPUOffloadPolicy (``CpuOffload``)."""
        from torch.distributed.device_mesh import init_device_mesh

        from harness.runtime.rank import rank_device

        self.spec, self.layout, self.recipe = spec, layout, recipe
        self.reshard_after_forward = layout.zero == 3 if reshard_after_forward is None else reshard_after_forward
        self.ddp = _ddp(layout)
        """ZeRO 0 / 1 over replicas: DDP (+ ZeroRedundancyOptimizer), at tp 1."""
        self.tensor_parallel = isinstance(self.reshard_after_forward, bool) and not self.ddp
        """False (an int: FSDP2 reshards to a smaller group, and refuses DTensors there; DDP): plain parameters at tp
        1."""
        self.offload = offload
        dims, names = (layout.dp, layout.pp, layout.tp), ("dp", "pp", "tp")
        if layout.replicate > 1:  # HSDP: FSDP2 over the (replicate, shard) sub-mesh
            dims, names = (layout.replicate, layout.dp // layout.replicate, *dims[1:]), ("dp_replicate", "dp_shard",
                                                                                         *names[1:])
        if dims not in _MESHES:  # process groups are created once per layout and rank process
            _MESHES[dims] = init_device_mesh(rank_device().type, dims, mesh_dim_names=names)
        self.mesh = _MESHES[dims]

    def _build(self, model):
        from harness.adapters.torch.stack_trainer import Torch3D

        layout, recipe = self.layout, self.recipe
        if recipe.low_precision is not None:  # torchao's Float8Linear / MXFP8Linear in the blocks, before TP/PP/FSDP2
            from harness.adapters.torchao.low_precision import float8_blocks

            float8_blocks(model, recipe.low_precision)
        build = self.three_d or Torch3D
        trainer = build(model, layout.dp, layout.pp, layout.tp, layout.schedule, layout.num_microbatches,
                        recipe.optimizer.lr, mesh=self.mesh, optimizer=recipe.optimizer,
                        reshard_after_forward=self.reshard_after_forward, accumulation=recipe.accumulation,
                        checkpointing=layout.checkpoint_policy if layout.checkpointing else None,
                        compile=layout.compile, tensor_parallel=self.tensor_parallel, offload=self.offload,
                        lr_schedule=recipe.lr_schedule, sequence_parallel=layout.sequence_parallel,
                        ddp=layout.zero if self.ddp else None)
        trainer.max_grad_norm, trainer.norm_type = recipe.max_grad_norm, recipe.norm_type
        if self.spec.dtype == "float16":  # torch's AMP scaler at the contract's dynamic rule (its factors: torch's)
            import torch

            from harness.runtime.rank import rank_device

            trainer.scaler = (self.scaler_class or torch.amp.GradScaler)(
                rank_device().type, init_scale=recipe.loss_scale, growth_interval=recipe.growth_interval)
        return trainer

    def step(self, tokens, targets) -> float:
        from harness.runtime.rank import rank_device

        return self.trainer.step(tokens.to(rank_device()), targets.to(rank_device()))

    def dense_state(self) -> dict:
        from harness.stack.dense import full_tensors

        t, spec = self.trainer, self.recipe.optimizer
        state = t.state
        mine = {"params": {t.names[n]: p.detach() for n, p in t.stage.named_parameters()},
                "optimizer": {t.names[n]: {k: state[p][k]
                                           for k in spec.state_keys_of(t.names[n], p.shape) if k in state.get(p, {})}
                              for n, p in t.stage.named_parameters()
                              if t.ddp != 1 or p in state}}  # ZeroRedundancyOptimizer: its owner's, from its rank
        mine = full_tensors(mine)
        # every stage's tensors, on every rank (harness.stack.dense: its own as it holds them)
        params, optimizer = gathered(mine["params"]), gathered(mine["optimizer"])
        if self.spec.tie_embeddings:  # named once (the embedding's): under both names, its state once
            tied(params, optimizer)
        return {"params": params, "optimizer": optimizer, "grad_norm": t.last_grad_norm}

    def traced_modules(self) -> dict:
        """{one-device module name: this rank's module} (``harness.localise``)."""
        from harness.localise.names import modules_by_parameters

        t = self.trainer
        names = {id(p): t.names[n] for n, p in t.stage.named_parameters()}
        return modules_by_parameters(self.spec, [t.stage], lambda p: names.get(id(p)))

    def memory(self) -> dict:
        """Bytes of model state this rank holds between steps: its local shards (FSDP2 keeps parameters
        sharded between steps at ZeRO 2 and 3 alike: reshard_after_forward only decides whether backward
        gathers them again), their gradients and the optimizer state."""
        import torch

        def held(tensors) -> int:
            local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors if t is not None]
            return sum(t.numel() * t.element_size() for t in local)

        t = self.trainer
        params = list(t.stage.parameters())
        state = [v for st in t.state.values() for v in st.values() if torch.is_tensor(v)]
        return {"params": held(params), "grads": held(p.grad for p in params), "optimizer": held(state)}

    resumes_lr_schedule = True
    """``save`` / ``load`` carry the learning-rate scheduler's position (``harness.stack.case.resume_stack``)."""

    def _dcp_state(self, saving: bool = False) -> dict:
        """This rank's tensors under DCP keys; the optimizer state of a parameter not stepped yet as zeros
        (Adam's ``step`` a scalar), to be filled in place by ``dcp.load``. ``saving`` at ZeRO 1: each state tensor made
        whole on every replica first."""
        import torch
        import torch.distributed as dist

        from harness.runtime.rank import rank_device

        t, spec, out = self.trainer, self.recipe.optimizer, {}
        for local, p in t.stage.named_parameters():
            name, state = t.names[local], t.state.get(p, {})
            out[f"model.{name}"] = p.data
            for key in spec.state_keys_of(name, p.shape):
                out[f"optim.{name}.{key}"] = state.get(key, torch.zeros_like(p.data))
            for key in spec.extra_state_of(name, p.shape):
                out[f"optim.{name}.{key}"] = state.get(key, torch.tensor(0.0))
        if saving and t.ddp == 1:  # ZeroRedundancyOptimizer: each state tensor on its owner only — every replica
            # saves it whole (the owner's plus the others' zeros), as DCP keeps one copy of a plain tensor
            group = t.mesh["dp"].get_group()
            for key in [k for k in out if k.startswith("optim.")]:
                # a copy on the rank's device (Adam's step lives on the CPU beside CUDA parameters; nccl has no CPU
                # backend), reduced, then back where the state keeps it
                whole = out[key].to(rank_device(), copy=True)
                dist.all_reduce(whole, group=group)
                out[key] = whole.to(out[key].device)
        if t.schedulers:  # their position (every scheduler's and every rank's the same: DCP keeps one)
            out["lr_scheduler.last_epoch"] = torch.tensor(float(t.schedulers[0].last_epoch))
        if t.scaler is not None:  # fp16: GradScaler's state_dict (the scale, its clean steps so far, its factors)
            out.update({f"scaler.{k}": torch.tensor(float(v)) for k, v in t.scaler.state_dict().items()})
        return out

    def save(self, directory) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(self._dcp_state(saving=True), checkpoint_id=_dcp_dir(directory))

    def load(self, directory) -> None:
        import torch.distributed.checkpoint as dcp

        state, t = self._dcp_state(), self.trainer
        dcp.load(state, checkpoint_id=_dcp_dir(directory))  # in place: the parameters' own storage, the state's
        spec = self.recipe.optimizer
        owned = None if t.ddp != 1 else {id(p) for g in t.optimizer.optim.param_groups for p in g["params"]}
        for local, p in t.stage.named_parameters():
            name = t.names[local]
            keys = spec.state_keys_of(name, p.shape) + spec.extra_state_of(name, p.shape)
            if owned is None or id(p) in owned:  # ZeroRedundancyOptimizer: its own parameters' state only
                t.state[p] = {key: state[f"optim.{name}.{key}"] for key in keys}
        if t.schedulers:  # rebuilt at their position
            t.schedulers = t.scheduled(int(state["lr_scheduler.last_epoch"]))
        if t.scaler is not None:  # each entry back in its own type (a float scale, an int count)
            t.scaler.load_state_dict({k: type(v)(state[f"scaler.{k}"].item())
                                      for k, v in t.scaler.state_dict().items()})


def _dcp_dir(directory) -> str:
    from pathlib import Path

    return str(Path(directory) / "dcp")


__all__ = ["TorchStack"]
