"""paritybench's pytest plugin (the session's cached Worlds, --world-sizes / --backend / --impl, conformance rows)
and its pytest-benchmark bridge."""
