"""The third-party stacks the World's fork server (``harness.runtime.spawn``) can preload where the session names them:
each one's modules, imported once there instead of in every rank that runs it (after torch's own preload a
rank spends ~1.7 s of CPU importing megatron-core and ~1.4 s torchtitan; a tox run's ranks imported torchtitan in 33
processes, megatron-core in 14, measured 2026-12-07). A stack whose import raises here is left out: the rank imports it
itself and meets the same error where it did before. Importing this module imports no stack: the server imports
``harness.runtime.preload_server``, which loads what its environment names."""

from __future__ import annotations

import importlib
import os

ENV = "PARITYBENCH_PRELOAD_STACKS"
"""Comma-separated names of ``IMPORTS`` the fork server imports (its environment is set for its start; read by
``harness.runtime.preload_server`` alone)."""


def _torchtitan() -> None:
    from harness.adapters.torchtitan.imports import import_torchtitan

    import_torchtitan()  # its patches for this machine first (no triton; the CPU's device), as a rank's import does
    for name in ("torchtitan.distributed", "torchtitan.config", "torchtitan.components.loss",
                 "torchtitan.components.optimizer"):
        importlib.import_module(name)


def _megatron() -> None:
    for name in ("megatron.core", "megatron.core.models.gpt", "megatron.core.models.gpt.gpt_layer_specs",
                 "megatron.core.optimizer", "megatron.core.distributed", "megatron.core.pipeline_parallel"):
        importlib.import_module(name)


IMPORTS = {"torchtitan": _torchtitan, "megatron": _megatron}
"""stack -> what imports its modules as the adapters' rank side does."""


def named_in(texts) -> list[str]:
    """The stacks of ``IMPORTS`` whose name is in one of ``texts`` (test ids, implementation names)."""
    texts = list(texts)
    return [stack for stack in IMPORTS if any(stack in text for text in texts)]


def load(names) -> dict[str, str]:
    """Import each named stack's modules; {name: why it was left out} for those whose import raised (never raises)."""
    left = {}
    for name in names:
        try:
            IMPORTS[name]()
        except Exception as exc:  # noqa: BLE001 - a stack this server cannot import is imported by its ranks instead
            left[name] = f"{type(exc).__name__}: {exc}"
    return left


def named_by_environment() -> list[str]:
    """The stacks ``ENV`` names (those of ``IMPORTS``; anything else is ignored)."""
    return [n for n in os.environ.get(ENV, "").split(",") if n in IMPORTS]
