"""Loads paritybench's pytest plugin (shared Worlds, --world-sizes/--backend/--impl/--results-dir)."""

pytest_plugins = ["harness.pytest.plugin"]
