"""The releases each third-party stack was measured on, and what a user on another one is told.

A verdict holds the install it ran on; what this table adds is whether that release is one the suite's own runs
cover (its adapters driven through that release's API, its findings' ranges measured there). On any other
release ``paritybench impls`` and the conformance matrix say so: the suite still judges it — a failure is a
failure, and a finding excuses only the releases its range names (``harness.records.findings``) — but nobody has looked
at it before you. Ranges are [first, last] releases measured, inclusive; update them with the matrix env's runs
(docs/guides/stacks.md, "Releases").
"""

from __future__ import annotations

from harness.records.versions import installed as _installed
from harness.records.versions import release as _release

TESTED: dict[str, tuple[str, str]] = {
    "torch": ("2.12.0", "2.15.0"),
    "deepspeed": ("0.18.0", "0.19.8"),
    "megatron-core": ("0.15.3", "0.19.2"),
    "torchtitan": ("0.2.2", "0.3.0"),
    "accelerate": ("1.13.0", "1.16.0"),
    "transformers": ("5.19.0", "5.25.0"),
    "torchao": ("0.18.0", "0.18.0"),
}
"""distribution -> (first, last) release the suite's runs cover — the release matrix's (``tox -e stacks-matrix``,
2026-12-03: DeepSpeed 0.18.0, 0.18.9, 0.19.0, 0.19.4, 0.19.8; megatron-core 0.15.3, 0.16.1, and 0.17.1, 0.18.2,
0.19.2 on Python 3.12; accelerate 1.13.0-1.16.0; torchtitan 0.2.2 (its Llama3: ``torchtitan_v02.py``) and
0.3.0), the compat envs' for torch (2.12.0: .ci/floors.txt); transformers 5.19.0, 5.20.2, 5.22.2, 5.23.0,
5.24.0 and 5.25.0 (2026-12-07; docs/guides/stacks.md, "Releases"); torchao 0.18.0, the newest (2026-12-03), in the
cpu env (the low-precision suite)."""

STACKS = {"deepspeed": "deepspeed", "megatron": "megatron-core", "torchtitan": "torchtitan", "accelerate": "accelerate",
          "torch": "torch"}
"""A built-in stack -> the distribution whose release it runs."""


DRIVEN = {"torchtitan": ("0.2.2", "torchtitan's 0.2.2 and 0.3 APIs (torchtitan_v02.py, torchtitan_stack.py): "
                                  "0.2.0 and 0.2.1 are not driven (the matrix holds each minor's newest patch)"),
          "transformers": ("5.19.0", "transformers' expert parallelism, DistributedConfig(ep_size=...): a field from "
                                     "5.19.0 (the class itself from 5.16.1; measured over the wheels 2026-12-03)")}
"""distribution -> (the oldest release the adapters drive, what they drive and why an older one is not)."""


def not_driven(module: str, drives: dict | None = None) -> str | None:
    """Why the installed release of the distribution behind ``module`` cannot be driven by its adapters (its
    release older than they drive: ``drives``, an implementation's own, else ``DRIVEN``), or None: the registry's
    skip reason for every implementation requiring it — unsupported with the exact reason, never a crash per case."""
    dist = module.split(".")[0]
    table = {**DRIVEN, **(drives or {})}
    if dist not in table:
        return None
    version = _installed(dist)
    oldest, what = table[dist]
    if version is None or _release(version) >= _release(oldest):
        return None
    return f"{dist} {version} is older than the adapters drive (>= {oldest}: {what})"


def tested(distribution: str, version: str) -> bool:
    """Whether ``version`` of ``distribution`` lies in the releases the suite's runs cover."""
    lo, hi = TESTED[distribution]
    return _release(lo) <= _release(version) <= _release(hi)


def release_note(distribution: str) -> str | None:
    """One line on the installed release of ``distribution``: tested or not, with the tested range; None where it
    is not installed or the table has no range for it."""
    version = _installed(distribution)
    if version is None or distribution not in TESTED:
        return None
    lo, hi = TESTED[distribution]
    span = lo if lo == hi else f"{lo} to {hi}"
    if tested(distribution, version):
        return f"{distribution} {version}: a tested release ({span})."
    return (f"{distribution} {version}: NOT a release this suite was measured on (tested: {span}) — its verdicts "
            "hold this install, and no finding of another release excuses a failure here.")



TORCHTITAN_03 = {"torchtitan": ("0.3.0", "torchtitan 0.3's MoE and context-parallel modules (models.common): its "
                                         "0.2.x stack is driven for the Llama family only (torchtitan_v02.py)")}
"""``ImplSpec.drives`` of the adapters and probes that read 0.3's module layout."""
