"""Asking a built DeepSpeed engine for its universal checkpoint (the stack's resume and the resume suite's own
DeepSpeed cases)."""

from __future__ import annotations

from harness.contracts import Unsupported


def ask_universal(engine) -> None:
    """Have ``engine`` (built) load DeepSpeed's universal checkpoint: what its config's ``"checkpoint":
    {"load_universal": true}`` sets at initialisation, ``engine._config.load_universal_checkpoint`` — private,
    read by the engine's public ``load_universal_checkpoint()``. Set only where this DeepSpeed keeps it so and its
    public reader then says True; elsewhere the route is unsupported in one sentence (nothing set: DeepSpeed's own
    state)."""
    config = getattr(engine, "_config", None)
    reader = getattr(engine, "load_universal_checkpoint", None)
    if not (hasattr(config, "load_universal_checkpoint") and callable(reader)):
        raise Unsupported("this DeepSpeed's engine keeps no _config.load_universal_checkpoint read by its "
                          "load_universal_checkpoint() (what its config's \"checkpoint\": {\"load_universal\": true} "
                          "sets): its universal checkpoint is not loaded here.")
    held = config.load_universal_checkpoint
    config.load_universal_checkpoint = True
    if reader() is not True:
        config.load_universal_checkpoint = held
        raise Unsupported("this DeepSpeed's load_universal_checkpoint() does not read "
                          "_config.load_universal_checkpoint (what its config's \"checkpoint\": {\"load_universal\": "
                          "true} sets): its universal checkpoint is not loaded here.")
