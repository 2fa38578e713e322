"""Profiles and calibration rows built from known α, β and rates: what the planner tests check against."""

from __future__ import annotations

import pandas as pd

from harness.cost_model.fit import collective_terms
from harness.cost_model.profile import Profile
from harness.cost_model.sweep import OPS

SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 22]


def alpha_beta(op: str, g: int) -> tuple[float, float]:
    """Distinct known values per (op, group size): α 10-40 µs, β of 1-8 GB/s."""
    k = OPS.index(op) + 1
    return 10e-6 * k + 1e-6 * g, 1 / (1e9 * (k + g))


def calibration_rows(world: int, backend: str = "nccl", rate: float = 2e12, overhead: float = 1e-4) -> pd.DataFrame:
    """The rows a calibration sweep would write on a machine that follows the α–β model exactly."""
    rows = []
    for g in [g for g in range(2, world + 1) if world % g == 0]:
        for op in OPS:
            a, b = alpha_beta(op, g)
            for s in SIZES:
                steps, volume = collective_terms(op, g, s)
                rows.append({"backend": backend, "world_size": world, "kind": "collective", "op": op, "group_size": g,
                             "dtype": "float32", "bytes": s, "time_p50_us": (steps * a + volume * b) * 1e6})
    for what, a, b in (("send", 5e-6, 1 / 20e9), ("one_way", 8e-6, 1 / 10e9)):
        rows += [{"backend": backend, "world_size": world, "kind": "p2p", "op": what, "group_size": 2,
                  "dtype": "float32", "bytes": s, "time_p50_us": (a + s * b) * 1e6} for s in SIZES]
    flops = 6e9
    rows.append({"backend": backend, "world_size": world, "kind": "compute", "op": "matmul", "group_size": 1,
                 "dtype": "bfloat16", "flops": flops, "time_p50_us": flops / rate * 1e6})
    rows.append({"backend": backend, "world_size": world, "kind": "compute", "op": "gpt_block", "group_size": 1,
                 "dtype": "bfloat16", "flops": flops, "time_p50_us": (flops / rate + overhead) * 1e6})
    return pd.DataFrame(rows)


def profile(world: int = 8, *, tp_alpha: float | None = None, free_comm: bool = False, rate: float = 1e10,
            overhead: float = 0.0, backend: str = "gloo", p2p: float | None = None) -> Profile:
    """A profile written by hand: every collective and group size of ``world``, point-to-point, one
    float32 matmul rate and a gpt_block overhead. ``tp_alpha`` overrides all_reduce's α (planted)."""
    prof = Profile(backend=backend, host={"cpu": "synthetic", "cores": 0, "device": "synthetic"})
    for g in [g for g in range(2, world + 1) if world % g == 0]:
        for op in OPS:
            a, b = (0.0, 0.0) if free_comm else alpha_beta(op, g)
            if op == "all_reduce" and tp_alpha is not None:
                a = tp_alpha
            prof.collectives.append({"op": op, "algorithm": "ring", "world_size": world, "group_size": g,
                                     "alpha_s": a, "beta_s_per_byte": b, "median_rel_error": 0.0,
                                     "max_rel_error": 0.0, "points": 4})
    for what in ("send", "one_way"):
        a = 0.0 if free_comm else (p2p if p2p is not None else 5e-6)
        prof.p2p.append({"what": what, "world_size": world, "alpha_s": a, "beta_s_per_byte": 0.0,
                         "median_rel_error": 0.0, "max_rel_error": 0.0, "points": 4})
    prof.compute += [{"kind": "matmul", "dtype": "float32", "world_size": world, "flops_per_s": rate},
                     {"kind": "gpt_block", "dtype": "float32", "world_size": world, "flops_per_s": rate,
                      "layer_s": 0.0, "overhead_s": overhead}]
    return prof
