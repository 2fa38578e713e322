"""Context parallelism: the sequence of the whole model split over a CP group (not Megatron's sequence
parallelism inside a TP group). ``layout``: contiguous and load-balanced (zigzag) sequence shards and each
rank's global positions; ``ring``: ring attention (pass-KV, online softmax, blockwise backward);
``ulysses``: all-to-all from sequence shards to head shards and back; ``attention``: the Llama family's
attention over a CP group with either. Their bytes and memory: ``reference.cost_model.context``. Every
communicating function takes its group."""

from .attention import ALGORITHMS, ContextParallelAttention, ContextParallelCore, attend_cp, every_position, full_grads
from .layout import LAYOUTS, chunks, positions, shard, unshard
from .ring import ring_attention
from .ulysses import ulysses_attention


class ReferenceContextParallel:
    """The ``context_parallel`` contract over ``ContextParallelAttention`` (``algorithm``: ring or ulysses)."""

    def __init__(self, algorithm: str = "ring", **planted):
        self.algorithm, self.planted = algorithm, planted
        self.description = {"ring": "ours: ring attention (pass-KV, online softmax)",
                            "ulysses": "ours: Ulysses all-to-all over heads"}[algorithm]

    def shard(self, dense, group, layout: str):
        return ContextParallelAttention(dense, group, layout, self.algorithm, **self.planted)

    def full_grads(self, sharded, group):
        return full_grads(sharded, group)


__all__ = ["ALGORITHMS", "LAYOUTS", "ContextParallelAttention", "ContextParallelCore", "ReferenceContextParallel",
           "attend_cp", "chunks", "every_position", "full_grads", "positions", "ring_attention", "shard",
           "ulysses_attention", "unshard"]
