"""Adapters holding accelerate's implementations to paritybench's contracts (and its shims)."""
