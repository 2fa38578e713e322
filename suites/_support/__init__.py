"""Test support shared by several test files of the suites (never in a ``test_*.py``)."""
