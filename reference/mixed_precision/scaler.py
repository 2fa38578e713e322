"""The dynamic loss scaler of fp16 training (Micikevicius et al. 2018, "Mixed Precision Training"; the
rule of torch's ``GradScaler`` and DeepSpeed's ``DynamicLossScaler``).

The loss is multiplied by ``scale`` before backward and the gradients by 1 / ``scale`` after (powers of
two: exact in any binary floating-point format, barring overflow). A step whose gradients hold an inf or
a NaN anywhere — on any rank: the caller reduces ``found_inf`` over every group first — is skipped and
the scale halved; after ``growth_interval`` steps in a row without one, the scale doubles. Its state
(``scale``, ``growth_tracker``) is training state: a resumed run must start from it.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from reference.stack.topology import all_reduce_over


class DynamicLossScaler:
    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, min_scale: float = 1.0):
        for name, value in (("growth_factor", growth_factor), ("backoff_factor", backoff_factor),
                            ("init_scale", init_scale), ("min_scale", min_scale)):
            if not (math.isfinite(value) and value > 0 and math.log2(value).is_integer()):
                raise ValueError(f"{name} must be a positive power of two (exact scaling); got {value}.")
        if growth_factor <= 1 or backoff_factor >= 1:
            raise ValueError(f"growth_factor must be > 1 and backoff_factor < 1; "
                             f"got {growth_factor}, {backoff_factor}.")
        if growth_interval < 1:
            raise ValueError(f"growth_interval must be at least 1; got {growth_interval}.")
        self.scale, self.growth_tracker = float(init_scale), 0
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval, self.min_scale = growth_interval, min_scale
        self.skipped = 0

    def update(self, found_inf: bool) -> bool:
        """After a step's gradients were checked everywhere: returns whether the optimizer may step."""
        if found_inf:
            self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            self.growth_tracker = 0
            self.skipped += 1
            return False
        self.growth_tracker += 1
        if self.growth_tracker == self.growth_interval:
            self.scale *= self.growth_factor
            self.growth_tracker = 0
        return True

    def update_from(self, grads, groups: dict) -> bool:
        """``update`` with ``found_inf``: whether any of ``grads`` on any rank of ``groups`` (as
        ``topology.all_reduce_over`` reads them; {} for one device) holds an inf or NaN — every rank of a
        3D layout decides the same, and skips together."""
        found = any(not bool(torch.isfinite(g).all()) for g in grads)
        flag = torch.tensor([float(found)], dtype=torch.float64, device=grads[0].device if grads else None)
        all_reduce_over(flag, groups, dist.ReduceOp.MAX)
        return self.update(bool(flag.item()))

    def state_dict(self) -> dict:
        return {"scale": self.scale, "growth_tracker": self.growth_tracker, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.growth_tracker = float(state["scale"]), int(state["growth_tracker"])
        self.skipped = int(state.get("skipped", 0))
