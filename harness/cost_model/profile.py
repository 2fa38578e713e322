"""The machine profile: what ``paritybench calibrate`` writes and ``plan --profile`` reads (JSON).

    {"profile_version": 1, "backend": "gloo", "world_sizes": [2, 8],
     "host": {"cpu": ..., "cores": 2, "device": "cpu", "torch": ..., "hostname": ...},
     "source": "sweep" or the run folder it was fitted from,
     "collectives": [{"op", "algorithm": "ring", "world_size", "group_size", "alpha_s", "beta_s_per_byte",
                      "median_rel_error", "max_rel_error", "points", "min_bytes", "max_bytes"}],
     "p2p": [{"world_size", "what": "send" | "one_way" | "loaded", "alpha_s", "beta_s_per_byte", ...fit quality}],
     "compute": [{"world_size", "dtype", "kind": "matmul", "flops_per_s"},
                 {"world_size", "dtype", "kind": "gpt_block" | "mlp_layer", "flops_per_s", "layer_s", "overhead_s"}]}

``world_size`` is how many ranks ran at once when it was measured (all of them busy): on a host with
fewer cores than ranks that is what a rank gets, so a profile answers only for the world sizes it holds.
``group_size`` is the ranks of one collective; the world's other ranks ran the same collective in their
own groups at the same time (as the TP or DP groups of a 3D layout do).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

PROFILE_VERSION = 1


class ProfileError(ValueError):
    """A profile that cannot answer what is asked, or a file that is not a profile; one sentence."""


@dataclass
class Profile:
    backend: str
    host: dict
    collectives: list[dict] = field(default_factory=list)
    p2p: list[dict] = field(default_factory=list)
    compute: list[dict] = field(default_factory=list)
    source: str = "sweep"

    @property
    def world_sizes(self) -> list[int]:
        return sorted({int(e["world_size"]) for e in self.collectives + self.p2p + self.compute})

    def to_json(self) -> dict:
        return {"profile_version": PROFILE_VERSION, "backend": self.backend, "world_sizes": self.world_sizes,
                "host": self.host, "source": self.source, "collectives": self.collectives, "p2p": self.p2p,
                "compute": self.compute}

    def save(self, path) -> Path:
        from harness.records.results import atomic_write_text

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(self.to_json(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path) -> Profile:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise ProfileError(f"cannot read the profile {str(path)!r}: {exc.strerror or exc}.") from None
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{str(path)!r} is not a profile: not valid JSON ({exc.msg}, line {exc.lineno}).") \
                from None
        if not isinstance(data, dict) or data.get("profile_version") != PROFILE_VERSION:
            found = data.get("profile_version") if isinstance(data, dict) else type(data).__name__
            raise ProfileError(f"{str(path)!r} is not a profile of version {PROFILE_VERSION} (found {found!r}); "
                               "write one with 'paritybench calibrate --out PROFILE.json'.")
        try:
            profile = cls(backend=str(data["backend"]), host=dict(data["host"]), collectives=list(data["collectives"]),
                          p2p=list(data["p2p"]), compute=list(data["compute"]), source=str(data.get("source", "")))
            for entry in profile.collectives + profile.p2p:
                float(entry["alpha_s"]), float(entry["beta_s_per_byte"]), int(entry["world_size"])
            for entry in profile.compute:
                float(entry["flops_per_s"]), int(entry["world_size"]), str(entry["dtype"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(f"{str(path)!r} is not a valid profile: {type(exc).__name__} {exc}.") from None
        return profile

    def check(self, backend: str | None, world_size: int) -> None:
        """Refuse a plan this profile was not measured for (another backend, another world size)."""
        if backend and backend != self.backend:
            raise ProfileError(f"the profile was measured on backend {self.backend!r}, the plan asks for "
                               f"{backend!r}; calibrate with --backend {backend}.")
        if world_size not in self.world_sizes:
            raise ProfileError(f"the profile was measured at world size(s) {_join(self.world_sizes)}, the plan asks "
                               f"for {world_size} ranks; calibrate with --world-sizes {world_size}.")

    def collective_time(self, op: str, group_size: int, size: float, world_size: int) -> float:
        """Seconds of one ring-model collective on ``group_size`` ranks of ``world_size`` busy ones."""
        if group_size == 1:
            return 0.0
        from harness.cost_model.fit import collective_terms

        entry = self._find(self.collectives, world_size, f"{op} on {group_size} of {world_size} ranks",
                           op=op, group_size=group_size)
        steps, volume = collective_terms(op, group_size, size)
        return steps * float(entry["alpha_s"]) + volume * float(entry["beta_s_per_byte"])

    def message_time(self, what: str, size: float, world_size: int, missing: float | None = None) -> float:
        """Seconds of one point-to-point message: ``send`` (what the sender pays to post and complete it),
        ``one_way`` (from the send's start to the receiver holding the data) or ``loaded`` (what it costs
        ranks that are computing). ``missing``: the answer where the profile has no such entry (else refuse)."""
        if missing is not None and not any(e.get("what") == what and int(e["world_size"]) == world_size
                                           for e in self.p2p):
            return missing
        entry = self._find(self.p2p, world_size, f"point-to-point ({what}) among {world_size} ranks", what=what)
        return float(entry["alpha_s"]) + size * float(entry["beta_s_per_byte"])

    def flops_per_s(self, dtype: str, world_size: int) -> float:
        """The GEMM rate of one rank while all ``world_size`` ranks compute."""
        entry = self._find(self.compute, world_size, f"{dtype} matmul rate with {world_size} ranks busy", dtype=dtype,
                           kind="matmul")
        return float(entry["flops_per_s"])

    def layer_overhead(self, kind: str, dtype: str, world_size: int) -> float | None:
        """Seconds one layer of ``kind`` (forward + backward) takes beyond its GEMMs at the matmul rate: what
        tensor parallelism does not divide. None where the profile did not time that layer."""
        for e in self.compute:
            if e.get("kind") == kind and e["dtype"] == dtype and int(e["world_size"]) == world_size:
                return float(e["overhead_s"])
        return None

    def _find(self, entries: list[dict], world_size: int, asked: str, **match) -> dict:
        for e in entries:
            if int(e["world_size"]) == world_size and all(e.get(k) == v for k, v in match.items()):
                return e
        raise ProfileError(f"the profile has no {asked} (it holds world sizes {_join(self.world_sizes)}); "
                           f"calibrate with --world-sizes {world_size}.")


def _join(values) -> str:
    return ", ".join(map(str, values)) or "none"
