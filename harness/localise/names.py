"""A stack's modules under the one-device model's module names, derived from its parameters' names — what an
adapter's optional ``traced_modules()`` returns with one call.

A stack module maps to the one-device module whose parameters it holds, all of them and only them (its own and
its children's, named as one device names them): a TP-split attention holding shards of ``blocks.3.attn.{q,k,v,o}``
is ``blocks.3.attn``; a module holding part of a one-device module's parameters (GPT's parallel MLP: ``fc1`` and
``fc2`` of a block that has more) or none (an attention core, a dropout) maps to nothing. Of several stack modules
mapping to one name (a checkpoint or FSDP wrapper and what it wraps), the outermost is kept."""

from __future__ import annotations

from functools import cache


@cache
def _dense_params_under(spec) -> dict[str, frozenset]:
    """{one-device module name: the names of every parameter under it} (the root excluded)."""
    model = spec.build(0)
    params = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    out = {}
    for name, _ in model.named_modules():
        if name:
            out[name] = frozenset(p for p in params if p.startswith(name + "."))
    return out


def _common_module(names: set[str]) -> str:
    """The longest dotted prefix every name shares, short of a parameter's own last component."""
    split = [n.split(".")[:-1] for n in names]
    prefix = []
    for parts in zip(*split, strict=False):
        if len(set(parts)) != 1:
            break
        prefix.append(parts[0])
    return ".".join(prefix)


def modules_by_parameters(spec, roots, dense_name) -> dict:
    """{one-device module name: stack module} for the modules under ``roots`` (an iterable of nn.Modules) whose
    parameters are exactly one one-device module's; ``dense_name(parameter)`` -> the one-device name of a stack
    parameter, or None (not one of the model's)."""
    under = _dense_params_under(spec)
    out: dict = {}
    for root in roots:
        for _, module in root.named_modules():
            names = {dense_name(p) for p in module.parameters()}
            if not names or None in names:
                continue
            target = _common_module(names)
            if target and target not in out and under.get(target) == frozenset(names):
                out[target] = module
    return out


WRAPPERS = frozenset({"module", "_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})
"""Path components a wrapper adds (DDP's and DeepSpeed's ``module``, FSDP1's, torch's checkpoint wrapper's,
``torch.compile``'s): dropped before a stack's parameter name is matched with one device's."""


def _roots(obj, depth: int = 3) -> list:
    """The nn.Modules a trainer holds in its attributes (lists, tuples and dicts of them too), outermost only."""
    from torch import nn

    found, seen, todo = [], set(), [(obj, 0)]
    while todo:
        item, d = todo.pop(0)
        if id(item) in seen or d > depth:
            continue
        seen.add(id(item))
        if isinstance(item, nn.Module):
            found.append(item)
        elif isinstance(item, list | tuple):
            todo += [(x, d + 1) for x in item]
        elif isinstance(item, dict):
            todo += [(x, d + 1) for x in item.values()]
        elif hasattr(item, "__dict__") and not isinstance(item, type) and d < depth:
            todo += [(x, d + 1) for x in vars(item).values()]
    return found


def discovered(trainer, spec) -> dict:
    """{one-device module name: module} of a stack without ``traced_modules``, found by its parameters' own names:
    the modules of every nn.Module the trainer holds whose parameters are named as one device names them once the
    wrappers' components (``WRAPPERS``) and one common prefix are dropped — the stacks that train the one-device
    model itself, wrapped (DDP, FSDP, DeepSpeed's engine, accelerate's prepare) — only a module holding every one of
    the model's parameters. Empty where names differ or a rank holds part of the model."""
    dense = {n for names in _dense_params_under(spec).values() for n in names}
    for root in _roots(trainer):
        names = {}
        for name, p in root.named_parameters():
            parts = [c for c in name.split(".") if c not in WRAPPERS]
            match = next((".".join(parts[i:]) for i in range(len(parts)) if ".".join(parts[i:]) in dense), None)
            names[id(p)] = match
        if names and all(names.values()) and set(names.values()) == dense:  # the whole model, named as one
            # device names it (a pipeline stage's own block numbers would name other blocks: never guessed)
            found = modules_by_parameters(spec, [root], lambda p, names=names: names.get(id(p)))
            if found:
                return found
    return {}
