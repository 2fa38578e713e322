"""Adapters holding torchtitan's implementations to paritybench's contracts (and its shims)."""
