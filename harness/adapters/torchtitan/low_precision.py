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


def converter_config(recipe_name: str, emulate: bool = True):
    """The ``Float8LinearConfig`` torchtitan's float8 converter trains with for ``recipe_name``."""
    from .imports import import_torchtitan

    import_torchtitan()
    from torchtitan.components.quantization.float8 import Float8LinearConverter

    return Float8LinearConverter(Float8LinearConverter.Config(recipe_name=recipe_name, emulate=emulate)).torchao_config


class TorchtitanLowPrecision(TorchaoLowPrecision):
    description = "torchtitan's float8 converter (emulated): its torchao config; TP and FSDP2 as torchtitan applies"

    @staticmethod
    def _config(recipe: str, layout):
        if recipe not in _RECIPE_NAMES:
            raise Unsupported(f"torchtitan's float8 converter offers the rowwise recipes (recipe_name rowwise, "
                              f"rowwise_with_gw_hp), not {recipe}.")
        if layout.fp8_all_gather:
            raise Unsupported("torchtitan 0.3 has no FSDP float8 all-gather (its rowwise recipes' scales would span "
                              "the flat shards).")
        return converter_config(_RECIPE_NAMES[recipe])
