"""What the World's fork server imports where the session named third-party stacks to preload
(``harness.runtime.spawn``): importing it imports the stacks its environment names (``harness.runtime.preload``) —
its one effect, wanted in the server alone (a driver that reads ``preload``'s names imports no stack)."""

from __future__ import annotations

from harness.runtime.preload import load, named_by_environment

load(named_by_environment())
