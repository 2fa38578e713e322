"""Reference implementations of the parallelism primitives: clean, readable, held to single-device."""
