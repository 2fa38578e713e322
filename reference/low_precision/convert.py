"""A model's linear layers under a recipe: what the stack contract's ``Recipe.low_precision`` asks of every stack —
the linear layers of the blocks (attention and MLP projections) compute their three GEMMs from operands cast by the
recipe; the embedding, the norms and the LM head stay in the model's dtype (torchtitan's default filter leaves the
output layer out too).

``linear(x, w, b, recipe, where)`` is the layer's function for activations of any leading shape (the tokens are every
leading dimension). ``to_recipe(model, name)`` turns the dense ``nn.Linear`` layers of ``model.blocks`` into
``RecipeLinear`` in place (their parameters and names unchanged): the one-device recipe. A parallel layer of
``reference.tensor_parallel`` takes the recipe as its ``recipe_linear`` (``set_recipe``: the scaled linear with its
amaxes reduced over the TP group where its shard splits the tensor a scale spans)."""

from __future__ import annotations

import functools

import torch
from torch import nn

from .linear import scaled_linear
from .recipe import Recipe, recipe


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, rec: Recipe, where: dict | None = None):
    y = scaled_linear(x.reshape(-1, x.shape[-1]), w, rec, where).reshape(*x.shape[:-1], w.shape[0])
    return y if b is None else y + b


def _with(x, w, b, *, rec: Recipe, where: dict):
    return linear(x, w, b, rec, where)


class RecipeLinear(nn.Linear):
    """An ``nn.Linear`` whose GEMMs run under ``self.recipe`` on one device (every amax its whole tensor's)."""

    recipe: Recipe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.recipe)


def block_linears(model: nn.Module) -> list[nn.Linear]:
    """The dense linear layers of ``model``'s blocks (what a recipe converts), in module order."""
    return [m for m in model.blocks.modules() if type(m) is nn.Linear]


def to_recipe(model: nn.Module, name: str) -> nn.Module:
    rec = recipe(name)
    for layer in block_linears(model):
        layer.__class__ = RecipeLinear
        layer.recipe = rec
    return model


def set_recipe(modules, name: str, kinds: dict, tp_group=None) -> int:
    """Every module among ``modules`` whose type ``kinds`` maps to a tensor-parallel kind ("column": rows of the
    weight over ``tp_group``, "row": its columns) computes under recipe ``name``, each amax max-reduced over
    ``tp_group`` wherever the shard splits the tensor its scale spans (``layout.amax_groups``); returns how many."""
    import torch.distributed as dist

    from .layout import Layout, amax_groups

    rec, n = recipe(name), 0
    tp = dist.get_world_size(tp_group) if tp_group is not None else 1
    for m in modules:
        kind = next((k for t, k in kinds.items() if isinstance(m, t)), None)
        if kind is None:
            continue
        rows, cols = m.weight.shape
        shape = (rows * tp, cols) if kind == "column" else (rows, cols * tp)
        where = amax_groups(rec, Layout(kind), tp_group, tp, shape)
        m.recipe_linear, n = functools.partial(_with, rec=rec, where=where), n + 1
    return n
