"""The Megatron stack's save / load: Megatron-LM's sharded checkpoint through ``dist_checkpointing``."""

from __future__ import annotations

from harness.adapters.megatron.cpu import on_cpu
from harness.contracts import Unsupported


class MegatronCheckpoint:
    """Megatron-LM's checkpoint (``dist_checkpointing``) of a ``MegatronStackTrainer``: any layout reads what any other
    wrote."""

    resumes_lr_schedule = True
    """``save`` / ``load`` carry its ``OptimizerParamScheduler``'s position (``num_steps``)."""

    def _sharded(self, is_loading: bool) -> dict:
        """Megatron-LM's checkpoint contents (``generate_state_dict``): each model chunk's and the optimizer's
        sharded state dicts (global ShardedTensors: any layout reads what any other wrote; the distributed
        optimizer's in its ``fully_reshardable`` form)."""
        chunks = self.trainer
        model = {"model": chunks[0].sharded_state_dict()} if len(chunks) == 1 else \
            {f"model{i}": c.sharded_state_dict() for i, c in enumerate(chunks)}
        flat = {k: v for d in model.values() for k, v in d.items()}
        metadata = {"distrib_optim_sharding_type": "fully_reshardable"}
        # its OptimizerParamScheduler's state (plain numbers: dist_checkpointing's common state), as Megatron-LM's
        # generate_state_dict keeps it
        return model | {"optimizer": self.optimizer.sharded_state_dict(flat, is_loading=is_loading,
                                                                        metadata=metadata),
                        "opt_param_scheduler": self.scheduler.state_dict()}

    def save(self, directory) -> None:
        import importlib.util
        import multiprocessing
        import queue

        from megatron.core import dist_checkpointing
        from megatron.core.dist_checkpointing.strategies import filesystem_async

        if importlib.util.find_spec("psutil") is None:  # its finding: without psutil the save never returns
            raise Unsupported("megatron-core's checkpoint writer needs psutil, which megatron-core does not declare: "
                              "without it each writer process raises and the save waits for them forever (pip "
                              "install psutil).")

        # Its torch_dist writer forks a writer process per bucket (joined before save returns) and collects their
        # results through a queue it makes with a spawn-context Manager: a World's rank is a daemonic process
        # (multiprocessing forbids it children) whose spawn would re-run no main; for the save the rank is not
        # daemonic and the collecting queue (read in this process: the save is synchronous) is an in-process one
        config = multiprocessing.current_process()._config
        daemon, held = config.get("daemon"), filesystem_async._results_queue
        config["daemon"], filesystem_async._results_queue = False, queue.Queue()
        try:
            with on_cpu():
                dist_checkpointing.save(self._sharded(False), str(directory))
        finally:
            config["daemon"], filesystem_async._results_queue = daemon, held

    def load(self, directory) -> None:
        with on_cpu():
            from megatron.core import dist_checkpointing

            chunks = self.trainer
            for opt in self._optimizers():
                if hasattr(opt, "_init_optimizer_states_with_dummy_values"):  # the distributed optimizer's states,
                    opt._init_optimizer_states_with_dummy_values()  # to be replaced in place by the load (its own)
            state = dist_checkpointing.load(self._sharded(True), str(directory))
            for i, chunk in enumerate(chunks):
                loaded = state["model"] if len(chunks) == 1 else state[f"model{i}"]
                chunk.module.load_state_dict({k.removeprefix("module."): v for k, v in loaded.items()})
            self.optimizer.load_state_dict(state["optimizer"])
            # Megatron-LM's load_checkpoint: the scheduler steps to the saved num_steps, setting each group's lr and
            # weight decay there (override_opt_param_scheduler: its own lr settings over the checkpoint's)
            self.scheduler.load_state_dict(state["opt_param_scheduler"])
