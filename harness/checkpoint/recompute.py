"""What a checkpointed backward recomputes: each op the backward runs, counted by name (``aten.addmm``,
``aten.gelu``, ...) — a policy's effect seen in the ops, not only in the gradients (equal either way).

The count needs torch's ``TorchDispatchMode`` (``torch.utils._python_dispatch``, a private module): used behind a
guard that probes once per process that the mode sees an op inside an autograd backward. Where the import fails or
the probe counts otherwise, ``counter()`` is None and the recompute check is unsupported, saying why — the gradients
are still held bit for bit by ``case.compare`` (no public mode sees a dispatch-level recompute: a selective policy
replays the forward's Python and answers the saved ops from its cache)."""

from __future__ import annotations

import torch

_CLASS: list = []


def _counter_class():
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(getattr(func, "_overloadpacket", func))
            self.ops[name] = self.ops.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    return OpCounts


class _Probe(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return torch.mm(g, torch.eye(g.shape[1], dtype=g.dtype))


def counter():
    """A fresh op counter (a context manager with ``.ops``), or None where this torch's dispatch mode does not see a
    backward's ops (probed once)."""
    if not _CLASS:
        try:
            cls = _counter_class()
            x = torch.ones(2, 2, requires_grad=True)
            y = _Probe.apply(x).sum()
            with cls() as c:
                y.backward()
            _CLASS.append(cls if c.ops.get("aten.mm", 0) == 1 else None)
        except Exception:  # noqa: BLE001 - the private module moved or behaves otherwise: no count
            _CLASS.append(None)
    return _CLASS[0]() if _CLASS[0] is not None else None


def recomputed(impl, policy: str, count: int, hidden: int, dropout: float, dtype, seed: int = 0) -> dict | None:
    """{op: times it ran in the backward} of ``impl.wrap(layers, policy)`` (one forward, one backward of a sum of
    squares), or None where it cannot be counted. Raises ``NotImplementedError`` for a policy not provided."""
    from .case import layers

    c = counter()
    if c is None:
        return None
    module = impl.wrap(layers(count, hidden, dropout, seed, dtype), policy)
    x = torch.randn(3, hidden, dtype=dtype, generator=torch.Generator().manual_seed(seed)).requires_grad_()
    loss = module(x).pow(2).sum()
    with c:
        loss.backward()
    return dict(c.ops)
