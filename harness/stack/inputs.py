"""What the stack cases share (rank side): the global batch every rank is given, a failed rank's result,
the optimizer state flattened to one name per tensor."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import verdict

SEQ = 4


def seq_for(*layouts) -> int:
    """The sequence length of a case: ``SEQ``, or the least multiple of it that every layout's zigzag
    (2 cp chunks) splits."""
    return math.lcm(SEQ, *(2 * getattr(lay, "cp", 1) for lay in layouts))


def rows_for(layout, recipe) -> int:
    """The global batch's rows of a case: one per micro-batch of every replica and accumulation pass."""
    return layout.dp * layout.num_microbatches * recipe.accumulation


IGNORE = -100
"""The target that does not count (``torch.nn.functional.cross_entropy``'s default ``ignore_index``): padding."""


def global_batch(vocab: int, rows: int, seed: int, seq: int = SEQ,
                 padded: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, targets), ``rows`` x ``seq`` each, drawn from ``seed`` + 1: the same on every rank.

    ``padded``: each row right-padded as a tokenizer pads — row i keeps its first ``valid_counts(rows, seq)[i]``
    targets, the rest are ``IGNORE`` (``valid_counts``: why those counts)."""
    gen = torch.Generator().manual_seed(seed + 1)
    tokens, targets = (torch.randint(0, vocab, (rows, seq), generator=gen),
                       torch.randint(0, vocab, (rows, seq), generator=gen))
    if padded:
        keep = torch.tensor(valid_counts(rows, seq)).unsqueeze(1) > torch.arange(seq)
        targets = targets.masked_fill(~keep, IGNORE)
    return tokens, targets


def valid_counts(rows: int, seq: int) -> list[int]:
    """The counted targets of each row of a padded batch: from ``seq`` (row 0) down to 0 (the last row), falling
    with the row index. Contiguous blocks of rows are what a stack gives its data-parallel replicas, its
    accumulation passes and its pipeline micro-batches, so each of those holds a different count, the last
    one the fewest — and with one row per micro-batch (or per replica) the last has none at all; a right-padded
    row's zigzag context-parallel chunks differ too (the first chunk full, the last empty). Row 0 is full: the
    batch always counts something."""
    return [seq] if rows == 1 else [seq * (rows - 1 - i) // (rows - 1) for i in range(rows)]


def valid_tokens(targets: torch.Tensor) -> int:
    """The targets that count (not ``IGNORE``): the loss is their mean over the global batch."""
    return int((targets != IGNORE).sum())


def token_share(targets: torch.Tensor, shares: int) -> float:
    """What a trainer that averages ``shares`` equal parts (micro-steps x replicas) divides each part's summed
    loss by, for the average to be the mean over the global batch's ``valid_tokens``: valid / shares."""
    return valid_tokens(targets) / shares


def summed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The cross-entropy of ``logits`` (fp32 where low-precision, as the one-device model's loss) summed over the
    counted targets (``IGNORE`` counts nothing; no target counted: 0, not NaN)."""
    from reference.tensor_parallel.vocab import fp32_logits

    return F.cross_entropy(fp32_logits(logits).flatten(0, 1), targets.flatten(), reduction="sum", ignore_index=IGNORE)


class SharedTokenLoss:
    """A pipeline engine's loss function (logits, targets) for an engine that averages its micro-batches' losses
    (and its replicas' gradients): ``summed_cross_entropy`` / ``share``, set per step to ``token_share`` over
    micro-batches x replicas — the average is then the global batch's mean over its counted targets."""

    def __init__(self):
        self.share = 1.0

    def __call__(self, logits, targets):
        return summed_cross_entropy(logits, targets) / self.share


def flat_state(optimizer: dict) -> dict:
    """{name: {state key: tensor}} as {"name/key": tensor}."""
    return {f"{name}/{key}": t for name, state in optimizer.items() for key, t in state.items()}


def failed_here(detail: str) -> dict:
    """This rank caught the stack's exception: say so to the World (peers still inside are ended), and fail."""
    return verdict.failed_here(detail, losses=[])


def failed(detail: str) -> dict:
    """A rank's result where the stack failed (its own exception, or the World's verdict of a call that
    failed: ``harness.runtime.world.run_or_fail``)."""
    return verdict.failed(detail, losses=[])


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
