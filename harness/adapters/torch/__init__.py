"""Adapters holding torch's implementations to paritybench's contracts (and its shims)."""
