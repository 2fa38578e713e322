"""Adapters holding deepspeed's implementations to paritybench's contracts (and its shims)."""
