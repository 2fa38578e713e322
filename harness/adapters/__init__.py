"""Adapters holding third-party implementations to paritybench's contracts."""
