"""The one-device side of the localisation: the case's model trained on the whole batch with the same recipe, every
module's forward output and the gradient at it, every parameter's gradient (the whole batch's, and each data-
parallel replica's rows' share before any reduction), the gradient norm, the clipped gradients and the update —
per step, in the order one device computes them."""

from __future__ import annotations

import math

import torch

from reference.models.moe import zero_missing_grads
from reference.zero import Scheduled

from ..stack.inputs import IGNORE


def _first(out):
    out = out[0] if isinstance(out, tuple | list) and out else out
    return out if torch.is_tensor(out) and out.is_floating_point() else None


class _Hooks:
    def __init__(self, model):
        self.forward, self.backward, self.order, self.back_order, self.param_order = {}, {}, [], [], []
        self.handles = []
        for name, module in model.named_modules():
            if name:
                self.handles.append(module.register_forward_hook(self._hook(name)))
        for name, p in model.named_parameters():
            self.handles.append(p.register_post_accumulate_grad_hook(
                lambda p, name=name: None if name in self.param_order else self.param_order.append(name)))

    def _hook(self, name):
        def hook(module, args, out):
            t = _first(out)
            if t is None or name in self.forward:
                return
            self.forward[name] = t.detach().to(torch.float64).clone()
            if name not in self.order:
                self.order.append(name)
            if t.requires_grad:
                t.register_hook(lambda g: self._grad(name, g))
        return hook

    def _grad(self, name, g):
        self.backward[name] = g.detach().to(torch.float64).clone()
        if name not in self.back_order:
            self.back_order.append(name)

    def close(self):
        for h in self.handles:
            h.remove()


def _batch_dims(model, tokens) -> dict[str, int]:
    """{module: the dimension of its output that is the batch's rows}: the one whose size doubles when the batch
    does (a sequence-first attention's is 1)."""
    sizes: dict = {}

    def probe(name):
        return lambda m, a, out: sizes.setdefault(name, []).append(tuple(_first(out).shape)) \
            if _first(out) is not None else None
    handles = [m.register_forward_hook(probe(n)) for n, m in model.named_modules() if n]
    with torch.no_grad():
        model(tokens)
        model(torch.cat([tokens, tokens]))
    for h in handles:
        h.remove()
    out = {}
    for name, (a, b, *_) in sizes.items():
        doubled = [i for i, (x, y) in enumerate(zip(a, b, strict=False)) if y == 2 * x]
        if doubled:
            out[name] = doubled[0]
    return out


def _replica_grads(model, tokens, targets, dp: int) -> list[dict]:
    """Each of ``dp`` contiguous row blocks' share of the whole batch's mean-loss gradient (its rows' summed
    cross-entropy / the whole batch's counted targets): what a replica holds before the reduction."""
    counted = int((targets != IGNORE).sum())
    per = len(tokens) // dp
    out = []
    for d in range(dp):
        rows = slice(d * per, (d + 1) * per)
        model.zero_grad(set_to_none=True)
        mine = int((targets[rows] != IGNORE).sum())
        key = getattr(model, "dropout_key", None)
        if key is not None:
            key.samples = torch.arange(rows.start, rows.stop)
        if mine:
            (model.loss(tokens[rows], targets[rows]) * (mine / counted)).backward()
        if key is not None:
            key.samples = None
        out.append({n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().to(torch.float64).clone()
                    for n, p in model.named_parameters()})
    model.zero_grad(set_to_none=True)
    return out


def one_device_trace(spec, recipe, seed: int, tokens, targets, steps: int, replicas: int | None = None) -> dict:
    """{"steps": [{"forward", "backward": {module: tensor}, "grads", "clipped", "update": {parameter: tensor},
    "norm", "replicas": [{parameter: tensor}] or None}], "order", "back_order", "param_order", "batch_dim",
    "initial": {parameter: tensor}}. ``replicas``: how many data-parallel row blocks' own gradients to give."""
    model = spec.build(seed)
    batch_dim = _batch_dims(model, tokens)
    opt = recipe.optimizer.build_named(model.named_parameters())
    lr = Scheduled(recipe.lr_schedule)  # each update at its schedule's learning rate
    hooks = _Hooks(model)
    initial = {n: p.detach().to(torch.float64).clone() for n, p in model.named_parameters()}
    out = []
    try:
        for step in range(steps):
            model.dropout_key.step = step
            per_replica = _replica_grads(model, tokens, targets, replicas) if replicas else None
            hooks.forward, hooks.backward = {}, {}
            opt.zero_grad()
            loss = model.loss(tokens, targets)
            loss.backward()
            zero_missing_grads(model.parameters())
            grads = {n: p.grad.detach().to(torch.float64).clone() for n, p in model.named_parameters()}
            norm = None
            if recipe.max_grad_norm is not None:
                norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm,
                                                            recipe.norm_type))
            clipped = {n: p.grad.detach().to(torch.float64).clone() for n, p in model.named_parameters()}
            before = {n: p.detach().to(torch.float64).clone() for n, p in model.named_parameters()}
            lr.before_update([opt])
            opt.step()
            lr.after_update()
            update = {n: p.detach().to(torch.float64) - before[n] for n, p in model.named_parameters()}
            out.append({"forward": hooks.forward, "backward": hooks.backward, "grads": grads, "clipped": clipped,
                        "update": update, "norm": norm, "replicas": per_replica, "loss": float(loss.detach())})
    finally:
        hooks.close()
    return {"steps": out, "order": hooks.order, "back_order": hooks.back_order, "param_order": hooks.param_order,
            "batch_dim": batch_dim, "initial": initial}


def gradient_from_state(optimizer_spec, now: dict, before: dict | None) -> dict | None:
    """The gradient the optimizer was given at a step, read back from its state (SGD with momentum: buffer_k -
    momentum x buffer_{k-1}; Adam: (exp_avg_k - beta1 x exp_avg_{k-1}) / (1 - beta1)); None when the state does
    not hold it."""
    key, keep, scale = (("momentum_buffer", optimizer_spec.momentum, 1.0) if optimizer_spec.name == "sgd" else
                        ("exp_avg", optimizer_spec.betas[0], 1.0 - optimizer_spec.betas[0]))
    if not keep and optimizer_spec.name == "sgd" or scale == 0:
        return None
    out = {}
    for name, state in now.items():
        if key not in state:
            continue
        prev = (before or {}).get(name, {}).get(key)
        prev = torch.zeros_like(state[key]) if prev is None else prev
        out[name] = (state[key] - keep * prev) / scale
    return out


def clip_coefficient(max_norm: float, norm: float | None) -> float:
    """torch's clipping coefficient: min(1, max_norm / (norm + 1e-6))."""
    if norm is None or not math.isfinite(norm):
        return 1.0
    return min(1.0, max_norm / (norm + 1e-6))
