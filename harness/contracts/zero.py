"""The data-parallel / ZeRO contract: train a model over a group, then hand back the full state."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Zero(Protocol):
    """Data parallelism (stage 0) and ZeRO stages 1, 2, 3 over a group of N ranks."""

    def build(self, model, optimizer, stage: int, group=None) -> ZeroTrainer:
        """A trainer for ``model`` (this rank's replica, identical on every rank; the trainer may wrap or
        modify it) with ``optimizer`` (reference.zero.OptimizerSpec: SGD with momentum or Adam) at ZeRO
        ``stage``. Raise ``Unsupported`` for what is not provided (e.g. a dtype), ValueError for a bad
        stage, in one sentence.

        Optional: a keyword ``recipe`` (reference.zero.StepRecipe), passed only by the seams suite:
        ``accumulation`` k — ``step(x, y)`` runs k micro-steps on equal row blocks, each loss divided by k,
        reducing over the group once; ``max_grad_norm`` / ``norm_type`` — clip the reduced gradient's
        global norm, and set ``trainer.last_grad_norm`` (the norm before clipping; None if not known);
        ``masked`` — target rows of NaN count nothing and the loss is the mean over the *global* batch's
        counted rows: ``recipe.share(y, group)`` all-reduces the slice's count, ``recipe.micro_loss`` is what
        each micro-step back-propagates (a rank or micro-step may count nothing: its loss is 0, not NaN). A
        build without the keyword is unsupported for those cases.

        Optional: a keyword ``replicate`` (an int dividing N), passed only by the hybrid-sharding suite: the N ranks
        as a replicate x (N / replicate) mesh, consecutive ranks sharding together (torch's
        ``init_device_mesh((replicate, N // replicate))``) — the stage's state sharded within each group of
        N / replicate ranks, each reduced shard all-reduced across the replicas, every gradient still the average
        over all N; 1 and N included (the degenerate meshes). ValueError for one that does not divide N or for
        stage 0; a build without the keyword is unsupported for those cases.

        Optional: a keyword ``offload`` (True), passed only by the offload suite: the sharded parameters' state on the
        host (the optimizer's; at stage 3 the parameters too), stepped there. ValueError for stage 0; unsupported
        where not provided."""


@runtime_checkable
class ZeroTrainer(Protocol):
    def step(self, x, y) -> float:
        """One optimizer step on this rank's slice (x, y) of the global batch, the loss being
        ``F.mse_loss(model(x), y)`` (mean over the slice); gradients are averaged over the group, so a
        step equals one device's step on the whole batch. Returns this rank's loss."""

    def full_params(self) -> dict:
        """Every parameter, full (gathered from the shards), keyed by ``model.named_parameters()``."""

    def full_grads(self) -> dict:
        """Every parameter's averaged gradient of the last step, full, keyed likewise."""

    def full_optimizer_state(self) -> dict:
        """{parameter name: {state key: full tensor}} with the keys of ``OptimizerSpec.state_keys``
        (``momentum_buffer``; ``exp_avg``, ``exp_avg_sq``)."""

    def memory(self) -> dict:
        """{"params", "grads", "optimizer"}: bytes this rank holds for each, measured from the tensors it
        keeps alive (each storage once), not computed from a formula: parameters and optimizer state as
        held after the last step, gradients as held during it, once reduced and before the update
        (implementations free them at different points afterwards)."""
