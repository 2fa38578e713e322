"""A model's linear layers under a recipe: what the stack contract's ``Recipe.low_precision`` asks of every stack —
the linear layers of the blocks (attention and MLP projections) compute their three GEMMs from operands cast by the
recipe; the embedding, the norms and the LM head stay in the model's dtype (torchtitan's default filter leaves the
output layer out too).

``linear(x, w, b, recipe, where)`` is the layer's function for activations of any leading shape (the tokens are every
leading dimension). ``to_recipe(model, name)`` turns the dense ``nn.Linear`` layers of ``model.blocks`` into
``RecipeLinear`` in place (their parameters and names unchanged): the one-device recipe. A parallel layer of
``reference.tensor_parallel`` takes the recipe as its ``recipe`` attribute (``set_recipe``), its amaxes reduced over
``amax_where``."""

from __future__ import annotations

import torch
from torch import nn

from .linear import scaled_linear
from .recipe import Recipe, recipe


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, rec: Recipe, where: dict | None = None):
    y = scaled_linear(x.reshape(-1, x.shape[-1]), w, rec, where).reshape(*x.shape[:-1], w.shape[0])
    return y if b is None else y + b


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


def set_recipe(modules, name: str, layer_types: tuple) -> int:
    """Every module of ``layer_types`` among ``modules`` computes under recipe ``name`` (whole-tensor amaxes: one
    tensor-parallel rank); returns how many."""
    rec, n = recipe(name), 0
    for m in modules:
        if isinstance(m, layer_types):
            m.recipe, m.amax_where, n = rec, {}, n + 1
    return n
