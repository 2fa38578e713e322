"""Adapters holding transformers's implementations to paritybench's contracts (and its shims)."""
