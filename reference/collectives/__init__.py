"""Reference collectives, built only on point-to-point send/recv.

| collective      | algorithm                          | bytes sent per rank (S = whole buffer)   |
|-----------------|------------------------------------|------------------------------------------|
| all_reduce      | ring (reduce-scatter + all-gather) | 2(N-1)/N * S                             |
| all_reduce      | recursive halving/doubling         | 2(P-1)/P * S (+ S on the 2E folded ranks)|
| all_reduce      | binomial tree (reduce + broadcast) | <= ceil(log2 N) * S                      |
| all_reduce      | naive central root                 | S, root (N-1) * S                        |
| reduce_scatter  | ring                               | (N-1)/N * S                              |
| all_gather      | ring                               | (N-1)/N * S                              |
| broadcast       | binomial tree                      | children * S, (N-1) * S in all           |
| reduce          | binomial tree                      | S (root 0), (N-1) * S in all             |
| all_to_all      | pairwise exchange                  | (N-1)/N * S                              |

Every function takes its process group explicitly and returns the bytes its rank sent.
"""

from __future__ import annotations

from .all_to_all import pairwise_all_to_all
from .naive import naive_all_reduce
from .p2p import REDUCE_OPS, Unsupported, chunk_bounds
from .rhd import rhd_all_reduce
from .ring import ring_all_gather, ring_all_reduce, ring_reduce_scatter
from .tree import tree_all_reduce, tree_broadcast, tree_reduce

ALL_REDUCE_ALGORITHMS = {
    "ring": ring_all_reduce,
    "rhd": rhd_all_reduce,
    "tree": tree_all_reduce,
    "naive": naive_all_reduce,
}

__all__ = [
    "ALL_REDUCE_ALGORITHMS", "REDUCE_OPS", "ReferenceCollectives", "Unsupported", "chunk_bounds",
    "naive_all_reduce", "pairwise_all_to_all", "rhd_all_reduce", "ring_all_gather", "ring_all_reduce",
    "ring_reduce_scatter", "tree_all_reduce", "tree_broadcast", "tree_reduce",
]


class ReferenceCollectives:
    """The collectives contract on the reference algorithms; ``all_reduce`` picks its algorithm.

    ``bytes_sent`` holds what this rank sent in the last call (for the communication-volume checks).
    """

    def __init__(self, all_reduce_algorithm: str = "ring", piece_bytes: int | None = None):
        if all_reduce_algorithm not in ALL_REDUCE_ALGORITHMS:
            raise ValueError(f"all_reduce_algorithm must be one of {', '.join(ALL_REDUCE_ALGORITHMS)}; "
                             f"got {all_reduce_algorithm!r}.")
        self.all_reduce_algorithm = all_reduce_algorithm
        self.piece_bytes = piece_bytes  # ring pipelining granularity; None: automatic
        self.bytes_sent = 0

    def all_reduce(self, tensor, op="sum", group=None):
        if self.all_reduce_algorithm == "ring":
            self.bytes_sent = ring_all_reduce(tensor, op, group, self.piece_bytes)
        else:
            self.bytes_sent = ALL_REDUCE_ALGORITHMS[self.all_reduce_algorithm](tensor, op, group)

    def reduce_scatter(self, output, input, op="sum", group=None):
        self.bytes_sent = ring_reduce_scatter(output, input, op, group, self.piece_bytes)

    def all_gather(self, output, input, group=None):
        self.bytes_sent = ring_all_gather(output, input, group, self.piece_bytes)

    def broadcast(self, tensor, src, group=None):
        self.bytes_sent = tree_broadcast(tensor, src, group)

    def reduce(self, tensor, dst, op="sum", group=None):
        self.bytes_sent = tree_reduce(tensor, dst, op, group)

    def all_to_all(self, output, input, group=None):
        self.bytes_sent = pairwise_all_to_all(output, input, group)
