"""Adapters holding megatron's implementations to paritybench's contracts (and its shims)."""
