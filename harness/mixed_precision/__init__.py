"""The mixed-precision case and its memory table (reference.mixed_precision)."""
