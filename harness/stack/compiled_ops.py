"""What a compiled block's backward recomputes: inductor runs its own kernels, which no dispatch mode sees, so a
compiled stack's recompute is read where torch.compile decides it — AOTAutograd's partition of the joint graph into a
forward and a backward (``functorch.compile.min_cut_rematerialization_partition``, the partitioner inductor uses,
which honours a selective-checkpoint policy's tags). ``recording()`` makes the stacks compile with a backend that
partitions each compiled region so and runs its two graphs as they are (no inductor), counting each op of every
backward graph by name: the ops the backward runs, the recomputed forward among them.

The stacks read the backend with ``backend()`` when they compile (the torch stack's ``torch.compile``, torchtitan's
``CompileConfig.backend``): "inductor" outside ``recording()``. ``functorch.compile`` is torch's (experimental,
public) AOT API: behind a guard that probes once per process that a recorded backward holds a matmul's gradient;
where it does not, ``recording`` yields None and the count is unsupported, saying why."""

from __future__ import annotations

import contextlib
import contextvars

_BACKEND: contextvars.ContextVar = contextvars.ContextVar("paritybench_compile_backend", default="inductor")
_WORKS: list = []


def backend():
    """The backend a stack compiles its blocks with: "inductor", or within ``recording()`` the recorder."""
    return _BACKEND.get()


class GraphOps:
    """A ``torch.compile`` backend: each region partitioned by AOTAutograd's min-cut partitioner (what inductor
    partitions with) and run as its FX graphs; ``ops`` {op name: count} over every backward graph it made."""

    def __init__(self):
        self.ops: dict[str, int] = {}

    def __call__(self, gm, example_inputs):
        from functorch.compile import aot_module_simplified, make_boxed_func, min_cut_rematerialization_partition

        def forward(graph, _inputs):
            return make_boxed_func(graph.forward)

        def backward(graph, _inputs):
            for node in graph.graph.nodes:
                if node.op == "call_function":
                    name = str(getattr(node.target, "_overloadpacket", node.target))
                    self.ops[name] = self.ops.get(name, 0) + 1
            return make_boxed_func(graph.forward)

        return aot_module_simplified(gm, example_inputs, fw_compiler=forward, bw_compiler=backward,
                                     partition_fn=min_cut_rematerialization_partition)


def _probe() -> bool:
    """Whether the recorder sees a compiled matmul's backward: one mm for each of its two gradients."""
    import torch

    rec = GraphOps()
    x = torch.ones(2, 2, requires_grad=True)
    w = torch.ones(2, 2, requires_grad=True)
    torch.compile(lambda a, b: torch.mm(a, b).sum(), backend=rec)(x, w).backward()
    return rec.ops.get("aten.mm", 0) == 2


@contextlib.contextmanager
def recording():
    """Within it the stacks compile with a fresh ``GraphOps`` (yielded), or None where this torch's AOT API does not
    record a backward (probed once per process)."""
    if not _WORKS:
        try:
            _WORKS.append(_probe())
        except Exception:  # noqa: BLE001 - the API moved or behaves otherwise: no count
            _WORKS.append(False)
    if not _WORKS[0]:
        yield None
        return
    import torch

    rec = GraphOps()
    token = _BACKEND.set(rec)
    torch.compiler.reset()  # a fresh cache: every block compiles here, with the recorder
    try:
        yield rec
    finally:
        _BACKEND.reset(token)
        torch.compiler.reset()  # the next stack compiles with inductor again
