"""The command line: ``main`` (argparse: ``paritybench``), ``bench``, ``report``, ``test`` — each a loop over the
paradigms' records (``harness.paradigm``). The parsing helpers users call are re-exported here."""

from .parsing import parse_bytes, parse_list, parse_world_sizes

__all__ = ["parse_bytes", "parse_list", "parse_world_sizes"]
