"""What the harness, the reference and the suites send over a process group is made on a device, not on the CPU by
default: under nccl (``tox -e gpu``) a World's default group has no CPU backend, so a tensor made by a torch factory
without ``device=`` and handed to a collective fails in the harness before the code under test runs — as the stacks'
loss reductions did (accelerate, DeepSpeed, megatron-core, torchtitan, transformers' EP) until they took
``rank_device()``. No GPU is needed to hold it: the source is read (one pass of ``ast``, < 1 s).

The pattern held is the one those were: ``t = torch.<factory>(...)`` (or the factory call itself) as a collective's
tensor argument, in one function, with no ``device=``. What only gloo runs is allowed below, with why."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FACTORIES = {"tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "rand", "randn", "randint"}
COLLECTIVES = {"all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "gather", "scatter",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "send", "recv", "isend",
               "irecv"}
GLOO_ONLY = {
    ("suites/harness/ranks.py", "groups_on_one_device"): "its groups are gloo groups it makes itself (backend='gloo')",
    ("suites/harness/ranks.py", "float8_all_gathered_as_bytes"): "the gloo float8 shim's test (gloo_only)",
}


def _factory_without_device(node) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FACTORIES
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
            and not any(k.arg == "device" for k in node.keywords))


def _collective(node) -> bool:
    """``dist.<collective>(...)`` or ``torch.distributed.<collective>(...)``."""
    f = node.func
    if not isinstance(f, ast.Attribute) or f.attr not in COLLECTIVES:
        return False
    owner = f.value
    return (isinstance(owner, ast.Name) and owner.id == "dist") or (
        isinstance(owner, ast.Attribute) and owner.attr == "distributed" and isinstance(owner.value, ast.Name)
        and owner.value.id == "torch")


def host_tensors_sent(source: str) -> list[tuple[int, str]]:
    """(line, function) of each collective in ``source`` whose tensor argument (its first two positional ones) is a
    torch factory's call without ``device=``, or a name the same function bound to one."""
    found = {}  # line -> the innermost function it is in (ast.walk meets an enclosing function first)
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        bound = {n.targets[0].id for n in ast.walk(fn) if isinstance(n, ast.Assign) and len(n.targets) == 1
                 and isinstance(n.targets[0], ast.Name) and _factory_without_device(n.value)}
        for call in ast.walk(fn):
            if isinstance(call, ast.Call) and _collective(call) and any(
                    _factory_without_device(a) or (isinstance(a, ast.Name) and a.id in bound) for a in call.args[:2]):
                found[call.lineno] = fn.name
    return sorted(found.items())


def test_the_pattern_is_seen_where_it_is_and_not_where_a_device_is_given():
    """The reader itself: the stacks' loss reduction as it was is found (bound to a name, passed directly, through
    ``torch.distributed``, nested in a method); with ``device=`` none is."""
    was = """
def step(total, dp):
    value = torch.tensor([total / dp], dtype=torch.float64)
    dist.all_reduce(value)
    return float(value)

class Trainer:
    def observed(self):
        torch.distributed.broadcast(torch.zeros(1), src=0)
        dist.all_to_all_single(out, torch.ones(4))
"""
    assert host_tensors_sent(was) == [(4, "step"), (9, "observed"), (10, "observed")]
    now = was.replace("torch.float64)", "torch.float64, device=rank_device())").replace(
        "torch.zeros(1)", "torch.zeros(1, device=d)").replace("torch.ones(4)", "torch.ones(4, device=d)")
    assert host_tensors_sent(now) == []
    assert host_tensors_sent("def f():\n    t = torch.ones(2)\n    dist.all_gather_object(box, t)\n") == []  # pickled


def test_nothing_sent_over_a_process_group_is_made_on_the_host_by_default():
    found, allowed_seen = [], set()
    for path in sorted(p for d in ("harness", "reference", "suites") for p in (ROOT / d).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for line, fn in host_tensors_sent(path.read_text()):
            if (rel, fn) in GLOO_ONLY:
                allowed_seen.add((rel, fn))
            else:
                found.append(f"{rel}:{line} in {fn}")
    assert found == [], ("made on the CPU by default and sent over a process group (nccl has no CPU backend: give "
                         "it device=rank_device(), or the device of the tensors it goes with): " + "; ".join(found))
    assert allowed_seen == set(GLOO_ONLY), f"allowed but no longer there: {sorted(set(GLOO_ONLY) - allowed_seen)}"
