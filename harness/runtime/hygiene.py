"""What one World call may leave patched in torch for the rest of its rank process's life, put back after each call:
the tests sharing a World must not inherit one test's third party. DeepSpeed's ZeRO 3 replaces
``torch.nn.functional.linear`` with its memory-efficient linear at ``deepspeed.initialize`` ("This will persist unless
manually reset"): every later call of that rank process — another stack, the one-device oracle — would compute its
linear layers through DeepSpeed's autograd Function, and a later compiled stack fails in inductor on it
("device_mesh._get_submesh is not an OpOverload": the torch stack's compiled FSDP2 case after DeepSpeed's ZeRO 3 cases,
thorough). Within its own call a stack runs as its users run it."""

from __future__ import annotations

import importlib

PATCH_POINTS = (("torch.nn.functional", "linear"),)
"""(module, attribute) a third party is known to rebind process-wide."""


def snapshot() -> list:
    """The patch points as they are now: [(module, attribute, value)]."""
    out = []
    for module, name in PATCH_POINTS:
        owner = importlib.import_module(module)
        out.append((owner, name, getattr(owner, name)))
    return out


def restore(saved: list) -> None:
    """Put each patch point back to ``saved``'s value."""
    for owner, name, value in saved:
        if getattr(owner, name) is not value:
            setattr(owner, name, value)
