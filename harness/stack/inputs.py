"""What the stack cases share (rank side): the global batch every rank is given, a failed rank's result,
the optimizer state flattened to one name per tensor."""

from __future__ import annotations

import math

import torch

from ..layer_case import failed as _failed
from ..layer_case import failed_here as _failed_here

SEQ = 4


def seq_for(*layouts) -> int:
    """The sequence length of a case: ``SEQ``, or the least multiple of it that every layout's zigzag
    (2 cp chunks) splits."""
    return math.lcm(SEQ, *(2 * getattr(lay, "cp", 1) for lay in layouts))


def global_batch(vocab: int, rows: int, seed: int, seq: int = SEQ) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, targets), ``rows`` x ``seq`` each, drawn from ``seed`` + 1: the same on every rank."""
    gen = torch.Generator().manual_seed(seed + 1)
    return (torch.randint(0, vocab, (rows, seq), generator=gen), torch.randint(0, vocab, (rows, seq), generator=gen))


def flat_state(optimizer: dict) -> dict:
    """{name: {state key: tensor}} as {"name/key": tensor}."""
    return {f"{name}/{key}": t for name, state in optimizer.items() for key, t in state.items()}


def failed_here(detail: str) -> dict:
    """This rank caught the stack's exception: say so to the World (peers still inside are ended), and fail."""
    return _failed_here(detail, losses=[])


def failed(detail: str) -> dict:
    """A rank's result where the stack failed (its own exception, or the World's verdict of a call that
    failed: ``harness.world.run_or_fail``)."""
    return _failed(detail, losses=[])


def replica_rows(tokens, targets, dp: int, replica: int, accumulation: int):
    """(this replica's tokens, its targets, rows per accumulation micro-step) of the global batch — one sentence
    for a batch that does not split evenly (never a remainder dropped): what a stack adapter's step takes."""
    if len(tokens) % dp:
        raise ValueError(f"the global batch's {len(tokens)} rows do not split evenly over dp = {dp} replicas; "
                         "pass a multiple of dp.")
    per = len(tokens) // dp
    if per % accumulation:
        raise ValueError(f"a replica's {per} rows cannot be split into {accumulation} accumulation steps.")
    mine = slice(replica * per, (replica + 1) * per)
    return tokens[mine], targets[mine], per // accumulation
