"""What one World call may leave patched in torch for the rest of its rank process's life, put back after each call:
the tests sharing a World must not inherit one test's third party. DeepSpeed's ZeRO 3 replaces
``torch.nn.functional.linear`` with its memory-efficient linear at ``deepspeed.initialize`` ("This will persist unless
manually reset"): every later call of that rank process — another stack, the one-device oracle — would compute its
linear layers through DeepSpeed's autograd Function, and a later compiled stack fails in inductor on it
("device_mesh._get_submesh is not an OpOverload": the torch stack's compiled FSDP2 case after DeepSpeed's ZeRO 3 cases,
thorough). Its ``zero.Init`` patches more for the span of its context (``nn.Module.__init_subclass__`` and ``apply``,
``torch.Tensor.__new__``, torch's tensor constructors, with quantized weights ``F.embedding``) and leaves
``__init_subclass__`` behind (its finding: ``harness.adapters.deepspeed.stack``); a context left by an exception leaves
them all. Within its own call a stack runs as its users run it."""

from __future__ import annotations

import importlib

PATCH_POINTS = (("torch.nn.functional", "linear"), ("torch.nn.functional", "embedding"),
                ("torch.nn.modules.module:Module", "__init_subclass__"), ("torch.nn.modules.module:Module", "apply"),
                ("torch:Tensor", "__new__"),
                *(("torch", name) for name in ("tensor", "empty", "zeros", "ones", "full", "arange", "eye", "randn")))
"""(module or "module:Class", attribute) a third party is known to rebind process-wide."""

ABSENT = object()
"""A class attribute the class does not define itself (``__init_subclass__``: inherited from ``object``)."""


def _owner(where: str):
    module, _, cls = where.partition(":")
    owner = importlib.import_module(module)
    return getattr(owner, cls) if cls else owner


def snapshot() -> list:
    """The patch points as they are now, as their owner defines them: [(owner, attribute, value or ``ABSENT``)]."""
    out = []
    for where, name in PATCH_POINTS:
        owner = _owner(where)
        out.append((owner, name, vars(owner).get(name, ABSENT)))
    return out


def restore(saved: list) -> None:
    """Put each patch point back to ``saved``'s value (one its owner did not define: removed again)."""
    for owner, name, value in saved:
        now = vars(owner).get(name, ABSENT)
        if now is value:
            continue
        if value is ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, value)
