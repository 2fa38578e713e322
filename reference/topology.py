"""3D-parallel topology: which rank holds which (data, pipeline, tensor) coordinate, and the groups.

Ranks are laid out TP innermost, then PP, then DP (Megatron's order): rank = (d * pp + p) * tp + t.
TP groups are then consecutive ranks (one node's NVLink domain), PP groups stride tp, DP groups stride
tp * pp. ``layout`` is a pure function; ``build_groups`` creates the process groups from it (every rank
must call it, with the same dims, in the same order — torch.distributed's rule for new_group).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelDims:
    dp: int
    """Data-parallel replicas (each holds a whole pipeline; ZeRO shards across them)."""
    pp: int
    """Pipeline stages (ranks; with interleaving each holds several virtual stages)."""
    tp: int
    """Tensor-parallel ranks sharing each layer."""

    def __post_init__(self):
        for name in ("dp", "pp", "tp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1; got {value!r}.")

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    def check(self, world_size: int, heads: int | None = None, layers: int | None = None) -> None:
        """One clear sentence for a layout that cannot run: product, heads or layers."""
        if self.world_size != world_size:
            raise ValueError(f"dp x pp x tp = {self.dp} x {self.pp} x {self.tp} = {self.world_size} must equal the "
                             f"world size ({world_size}).")
        if heads is not None and heads % self.tp:
            raise ValueError(f"tp ({self.tp}) must divide the attention heads ({heads}).")
        if layers is not None and self.pp > layers:
            raise ValueError(f"pp ({self.pp}) cannot exceed the number of layers ({layers}): a stage needs a layer.")


@dataclass(frozen=True)
class Coordinates:
    dp: int
    pp: int
    tp: int


def coordinates(dims: ParallelDims, rank: int) -> Coordinates:
    """Rank -> (dp, pp, tp) index, TP innermost."""
    if not 0 <= rank < dims.world_size:
        raise ValueError(f"rank {rank} is outside a world of {dims.world_size}.")
    return Coordinates(dp=rank // (dims.tp * dims.pp), pp=rank // dims.tp % dims.pp, tp=rank % dims.tp)


def rank_of(dims: ParallelDims, dp: int, pp: int, tp: int) -> int:
    return (dp * dims.pp + pp) * dims.tp + tp


def layout(dims: ParallelDims) -> dict[str, list[list[int]]]:
    """Every group of each kind as its list of global ranks: {"tp": [...], "pp": [...], "dp": [...],
    "embed": [...]}. "embed" (Megatron's embedding group): the first and the last pipeline rank of each
    (dp, tp) coordinate, which hold the input embedding and the LM head — tied weights' gradients are
    summed over it (one rank when pp = 1)."""
    r = range
    last = dims.pp - 1
    return {"tp": [[rank_of(dims, d, p, t) for t in r(dims.tp)] for d in r(dims.dp) for p in r(dims.pp)],
            "pp": [[rank_of(dims, d, p, t) for p in r(dims.pp)] for d in r(dims.dp) for t in r(dims.tp)],
            "dp": [[rank_of(dims, d, p, t) for d in r(dims.dp)] for p in r(dims.pp) for t in r(dims.tp)],
            "embed": [sorted({rank_of(dims, d, 0, t), rank_of(dims, d, last, t)}) for d in r(dims.dp)
                      for t in r(dims.tp)]}


def build_groups(dims: ParallelDims, rank: int) -> dict:
    """This rank's process groups {"tp", "pp", "dp", "embed"}, created collectively (every rank calls this)."""
    import torch.distributed as dist

    dims.check(dist.get_world_size())
    mine = {}
    for kind, groups in layout(dims).items():
        for ranks in groups:
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[kind] = group
    return mine


def all_reduce_over(tensor, groups: dict, op=None, kinds: tuple[str, ...] = ("tp", "pp", "dp")):
    """All-reduce ``tensor`` in place (``op``, default SUM) over each of ``groups``' groups named in ``kinds``,
    in that order — the whole 3D world when every kind is given. A missing key is a dimension of size 1;
    the value None is the default group. Returns ``tensor``."""
    import torch.distributed as dist

    op = dist.ReduceOp.SUM if op is None else op
    for kind in kinds:
        if kind in groups and dist.get_world_size(groups[kind]) > 1:
            dist.all_reduce(tensor, op=op, group=groups[kind])
    return tensor
