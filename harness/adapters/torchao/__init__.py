"""Adapters of torchao (float8 and MX training) to paritybench's contracts."""
