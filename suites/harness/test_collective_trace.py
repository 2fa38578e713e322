"""The collective trace's two ways back to torch's own functions (``harness.runtime.collective_trace``; the table of
docs/architecture.md, "Machines and findings", promises each a test): a function whose signature cannot be read is
left torch's own while the others are traced, and ``PARITYBENCH_TRACE_COLLECTIVES=0`` leaves every one torch's own.
In a fresh interpreter each: ``install`` patches torch.distributed process-wide, which the test process must not."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_SCRIPT = """
import json, os, sys
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from harness.runtime import collective_trace as trace
own = {op: getattr(c10d, op) for op in ("all_reduce", "broadcast", "barrier")}
if sys.argv[1] == "unreadable":
    own["all_reduce"].__signature__ = "not a signature"  # inspect.signature raises TypeError on it
installed = trace.install()
print(json.dumps({"installed": installed, "again": trace.install(),
                  "torchs_own": {op: getattr(dist, op) is fn and getattr(c10d, op) is fn for op, fn in own.items()}}))
"""


def _install(how: str, **env) -> dict:
    done = subprocess.run([sys.executable, "-c", _SCRIPT, how], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_collective_whose_signature_cannot_be_read_stays_torchs_own_and_the_others_are_traced():
    got = _install("unreadable", PARITYBENCH_TRACE_COLLECTIVES="1")
    assert got == {"installed": True, "again": True,
                   "torchs_own": {"all_reduce": True, "broadcast": False, "barrier": False}}, got


def test_tracing_turned_off_leaves_every_collective_torchs_own():
    got = _install("as-is", PARITYBENCH_TRACE_COLLECTIVES="0")
    assert got == {"installed": False, "again": False,
                   "torchs_own": {"all_reduce": True, "broadcast": True, "barrier": True}}, got
