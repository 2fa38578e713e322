"""DeepSpeed's bf16 in its stack: the config that turns it on (DeepSpeed rounds the model itself and keeps fp32
masters and optimizer state), and the reading of those masters under the one-device names."""

from __future__ import annotations

import torch

from harness.contracts import Unsupported


def bf16_config(spec) -> dict:
    """DeepSpeed's bf16 recipe (bf16 model, fp32 masters and optimizer state) for a bfloat16 spec; else none —
    unsupported where DeepSpeed's accelerator says this machine has no bf16."""
    if spec.dtype != "bfloat16":
        return {}
    from harness.runtime.capabilities import deepspeed_dtype_unsupported

    why = deepspeed_dtype_unsupported(torch.bfloat16)
    if why:
        raise Unsupported(f"DeepSpeed's bf16 does not run here: {why}.")
    return {"bf16": {"enabled": True}}


class MastersState:
    """DeepSpeed's fp32 masters and their optimizer state under the one-device names: ZeRO 0's
    ``FP16_UnfusedOptimizer`` keeps them in ``fp32_groups``, beside the model's parameters in ``fp16_groups`` (group by
    group: the client's order, not the model's once AdamW splits its groups), ZeRO 1-3 behind
    ``safe_get_full_fp32_param`` / ``safe_get_full_optimizer_state``."""

    def __init__(self, engine, optimizer, spec, stage, names, recipe=None):
        self.engine, self.optimizer, self.spec, self.stage, self.names = engine, optimizer, spec, stage, names

    def _masters(self) -> dict:
        params = dict(self.engine.module.named_parameters())
        if self.stage == 0:
            name = {id(p): n for n, p in params.items()}
            pairs = zip([p for group in self.optimizer.fp16_groups for p in group],
                        [m for group in self.optimizer.fp32_groups for m in group], strict=True)
            masters = {name[id(p)]: m for p, m in pairs}
            return {n: masters[n] for n in params}  # the model's order
        return params

    def full_params(self) -> dict:
        from deepspeed.utils import safe_get_full_fp32_param

        if self.stage == 0:
            return {k: m.detach().clone() for k, m in self._masters().items()}
        return {k: safe_get_full_fp32_param(p).detach().clone() for k, p in self._masters().items()}

    relink = True
    """As the ZeRO adapter's (``harness.adapters.deepspeed.zero._Trainer.relink``)."""

    def full_optimizer_state(self) -> dict:
        from deepspeed.utils import safe_get_full_optimizer_state

        if self.relink:  # a later parameter group's state linked (the finding)
            from .moe_stack import relink_groups

            relink_groups(self.optimizer, self.stage)
        if self.stage == 0:
            inner = self.optimizer.optimizer
            return {k: {key: inner.state[m][key].clone() for key in self.spec.state_keys}
                    for k, m in self._masters().items()}
        return {k: {key: safe_get_full_optimizer_state(p, key) for key in self.spec.state_keys}
                for k, p in self._masters().items()}

