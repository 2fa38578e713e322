"""Adapters holding flash_attn's implementations to paritybench's contracts (and its shims)."""
