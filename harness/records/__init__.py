"""The records: run folders (results), the registry of implementations, the findings registry with release ranges,
the releases driven and tested, scaling tables."""
