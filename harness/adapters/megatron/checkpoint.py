"""The Megatron stack's save / load: Megatron-LM's sharded checkpoint through ``dist_checkpointing``."""

from __future__ import annotations

import contextlib

from harness.adapters.megatron.cpu import on_cpu
from harness.contracts import Unsupported


@contextlib.contextmanager
def writers_in_a_rank():
    """Within it, megatron-core's synchronous torch_dist save can run in a World's rank. Its writer forks a process
    per bucket (joined before the save returns) and collects their results through a queue it makes with a
    spawn-context Manager: a World's rank is a daemonic process (multiprocessing forbids it children) whose spawn
    would re-run no main. So, for the save, the rank is not daemonic (CPython's private ``BaseProcess._config``:
    its "daemon") and the collecting queue — read in this process — is an in-process one (megatron-core's private
    module global ``filesystem_async._results_queue``, which it fills on first use). Each is set only where it is
    what it was written against (a dict; the module global present) and put back after; where one is not, that part
    is left to the library's own behaviour. Yields the names of what it set."""
    import multiprocessing
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    config = getattr(multiprocessing.current_process(), "_config", None)
    done = []
    with contextlib.ExitStack() as undo:
        if isinstance(config, dict):
            undo.callback(_put_back, config, "daemon", config.get("daemon", _ABSENT))
            config["daemon"] = False
            done.append("daemon")
        if hasattr(filesystem_async, "_results_queue"):
            undo.callback(setattr, filesystem_async, "_results_queue", filesystem_async._results_queue)
            filesystem_async._results_queue = queue.Queue()
            done.append("results queue")
        yield done


_ABSENT = object()


def _put_back(mapping: dict, key: str, held) -> None:
    if held is _ABSENT:
        mapping.pop(key, None)
    else:
        mapping[key] = held


def _dummy_states(optimizer) -> None:
    """The distributed optimizer's states made before a load replaces them in place — what Megatron-LM's loaders do
    (a freshly built one holds none; megatron-core's own load then asserts) — through its private
    ``_init_optimizer_states_with_dummy_values``; where this release has no such callable, loading is unsupported in
    one sentence (megatron-core's load without it is not what its users' trainer runs)."""
    make = getattr(optimizer, "_init_optimizer_states_with_dummy_values", None)
    if not callable(make):
        raise Unsupported("this megatron-core's DistributedOptimizer has no _init_optimizer_states_with_dummy_values "
                          "(what Megatron-LM's loaders make its states with before a load): its checkpoint is not "
                          "loaded here.")
    make()


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

        from megatron.core import dist_checkpointing

        if importlib.util.find_spec("psutil") is None:  # its finding: without psutil the save never returns
            raise Unsupported("megatron-core's checkpoint writer needs psutil, which megatron-core does not declare: "
                              "without it each writer process raises and the save waits for them forever (pip "
                              "install psutil).")

        with writers_in_a_rank(), on_cpu():
            dist_checkpointing.save(self._sharded(False), str(directory))

    def load(self, directory) -> None:
        with on_cpu():
            from megatron.core import dist_checkpointing

            chunks = self.trainer
            for opt in self._optimizers():
                if hasattr(opt, "model_param_group_index_map"):  # the distributed optimizer: its states made
                    _dummy_states(opt)  # as Megatron-LM's loaders make them, replaced in place by the load
            state = dist_checkpointing.load(self._sharded(True), str(directory))
            for i, chunk in enumerate(chunks):
                loaded = state["model"] if len(chunks) == 1 else state[f"model{i}"]
                chunk.module.load_state_dict({k.removeprefix("module."): v for k, v in loaded.items()})
            self.optimizer.load_state_dict(state["optimizer"])
            # Megatron-LM's load_checkpoint: the scheduler steps to the saved num_steps, setting each group's lr and
            # weight decay there (override_opt_param_scheduler: its own lr settings over the checkpoint's)
            self.scheduler.load_state_dict(state["opt_param_scheduler"])
