"""torchtitan's float8 training through the low-precision contract: the ``torchao_config`` its
``Float8LinearConverter`` builds (``torchtitan.components.quantization.float8``) for ``recipe_name`` with
``emulate=True`` (on a machine without SM89 its only mode), applied as torchtitan applies it — torchao's
``Float8Linear`` in place of the linear layer, torch's ``ColwiseParallel`` / ``RowwiseParallel`` for TP (torchtitan 0.3
has no float8 TP plan: its recipes are rowwise), FSDP2's ``fully_shard`` without a float8 all-gather (it has none).
Everything after the config is the torchao adapter's."""

from __future__ import annotations

from reference.errors import Unsupported

from ..torchao.low_precision import TorchaoLowPrecision

_RECIPE_NAMES = {"float8-rowwise": "rowwise"}


def emulated() -> bool:
    """Whether torchtitan's float8 converter runs emulated here: no CUDA device of compute capability 8.9 or more."""
    import torch

    return not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9))


MXFP8_WHY = ("torchtitan's MXFP8 converter (MXFP8LinearConverter, torchao's MXFP8Linear) has no emulated mode: it "
             "raises 'MXFP8 is only supported on SM100 or later architectures' without such a GPU, and this adapter "
             "drives its float8 converter only (torchao's MXFP8Linear itself is held: --impl torchao).")


def converter(recipe: str, emulate: bool = True):
    """torchtitan's ``Float8LinearConverter`` for the contract's ``recipe`` (its ``recipe_name``), the LM head left out
    (the contract's recipe is the blocks' linear layers)."""
    from .imports import import_torchtitan

    if recipe == "mxfp8":
        raise Unsupported(MXFP8_WHY)
    if recipe not in _RECIPE_NAMES:
        raise Unsupported(f"torchtitan's float8 converter offers the rowwise recipes (recipe_name rowwise, "
                          f"rowwise_with_gw_hp), not {recipe}.")
    import_torchtitan()
    from torchtitan.components.quantization.float8 import Float8LinearConverter

    return Float8LinearConverter(Float8LinearConverter.Config(recipe_name=_RECIPE_NAMES[recipe], emulate=emulate,
                                                              filter_fqns=["lm_head", "output"]))


def recipe_converter(recipe: str, emulate: bool):
    """torchtitan's float8 converter training ``recipe``: emulated, with the finding configured around — its
    ``torchao_config`` (a public attribute the converter hands each ``Float8Linear``) set to the recipe's own
    ``Float8LinearConfig.from_recipe_name(...)`` with ``emulate=True``, what its SM89 path builds but for the emulated
    GEMM. Returns (converter, None), or (converter as torchtitan built it, why not) where this torchtitan has no
    such attribute: then the caller declares the case unsupported, as the finding requires."""
    import dataclasses

    from torchao.float8 import Float8LinearConfig

    conv = converter(recipe, emulate)
    if not emulate:
        return conv, None
    if not hasattr(conv, "torchao_config"):
        return conv, (f"this torchtitan's float8 converter has no torchao_config to set, and emulated it trains "
                      f"tensorwise whatever recipe it is asked (the finding of suites/low_precision/"
                      f"test_torchtitan.py): {recipe} would not be what ran.")
    conv.torchao_config = dataclasses.replace(Float8LinearConfig.from_recipe_name(_RECIPE_NAMES[recipe]),
                                              emulate=True)
    return conv, None


def converter_config(recipe_name: str, emulate: bool = True):
    """The ``Float8LinearConfig`` torchtitan's float8 converter trains with for ``recipe_name``."""
    return converter({v: k for k, v in _RECIPE_NAMES.items()}[recipe_name], emulate).torchao_config


class TorchtitanLowPrecision(TorchaoLowPrecision):
    description = "torchtitan's float8 converter (emulated): its torchao config; TP and FSDP2 as torchtitan applies"

    @staticmethod
    def _config(recipe: str, layout):
        if recipe not in _RECIPE_NAMES:
            converter(recipe)  # its sentence
        if layout.fp8_all_gather:
            raise Unsupported("torchtitan 0.3 has no FSDP float8 all-gather (its rowwise recipes' scales would span "
                              "the flat shards).")
        return converter_config(_RECIPE_NAMES[recipe])
