"""3D-parallel topology: which rank holds which (data, pipeline, tensor) coordinate, and the groups.

Ranks are laid out TP innermost, then PP, then DP (Megatron's order): rank = (d * pp + p) * tp + t.
TP groups are then consecutive ranks (one node's NVLink domain), PP groups stride tp, DP groups stride
tp * pp. ``layout`` is a pure function; ``build_groups`` creates the process groups from it (every rank
must call it, with the same dims, in the same order — torch.distributed's rule for new_group).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

ORDER = ("dp", "pp", "cp", "tp")
"""The named dimensions, outermost first: a rank is the mixed-radix number of its coordinates in this order
(TP innermost, then CP — torchtitan's and Megatron's neighbours —, then PP, then DP). A later dimension
(expert) is a field of ``ParallelDims`` and a place in this order; every function below reads the order."""


@dataclass(frozen=True)
class ParallelDims:
    dp: int
    """Data-parallel replicas (each holds a whole pipeline; ZeRO shards across them)."""
    pp: int
    """Pipeline stages (ranks; with interleaving each holds several virtual stages)."""
    tp: int
    """Tensor-parallel ranks sharing each layer."""
    cp: int = 1
    """Context-parallel ranks: the sequence split over them (``reference.context_parallel``); parameters are
    replicated over cp, their gradients reduced — and ZeRO's shards split — over dp x cp."""
    ep: int = 1
    """Expert-parallel ranks (not a dimension of its own: it divides dp x cp, as torchtitan and Megatron lay
    it out): each data x context group's ranks in EP groups of ``ep`` consecutive ones, the experts split
    over each EP group, an expert's replicas — its expert-data-parallel group — one rank of each EP group."""

    replicate: int = 1
    """Hybrid sharding: each data x context group's ranks as replicate x shard (consecutive ranks shard together,
    torch's ``init_device_mesh((replicate, shard))``): groups "dp_shard" (where ZeRO shards) and "dp_replicate"
    (where each reduced shard is all-reduced) when > 1."""

    def __post_init__(self):
        if not isinstance(self.replicate, int) or isinstance(self.replicate, bool) or self.replicate < 1 \
                or (self.dp * self.cp) % self.replicate:
            raise ValueError(f"replicate ({self.replicate!r}) must be a whole number dividing dp x cp "
                             f"({self.dp * self.cp}).")
        if not isinstance(self.ep, int) or isinstance(self.ep, bool) or self.ep < 1:
            raise ValueError(f"ep must be a whole number >= 1; got {self.ep!r}.")
        if (self.dp * self.cp) % self.ep:
            raise ValueError(f"ep ({self.ep}) must divide dp x cp ({self.dp} x {self.cp} = {self.dp * self.cp}): the "
                             "experts are split over data- and context-parallel ranks.")
        for name in ORDER:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1; got {value!r}.")

    @property
    def sizes(self) -> dict[str, int]:
        """{dimension: size}, outermost first."""
        return {name: getattr(self, name) for name in ORDER}

    @property
    def world_size(self) -> int:
        return math.prod(self.sizes.values())

    def check(self, world_size: int, heads: int | None = None, layers: int | None = None) -> None:
        """One clear sentence for a layout that cannot run: product, heads or layers."""
        if self.world_size != world_size:
            shown = [n for n in ORDER if n != "cp" or self.cp > 1]
            names, values = " x ".join(shown), " x ".join(str(getattr(self, n)) for n in shown)
            raise ValueError(f"{names} = {values} = {self.world_size} must equal the world size ({world_size}).")
        if heads is not None and heads % self.tp:
            raise ValueError(f"tp ({self.tp}) must divide the attention heads ({heads}).")
        if layers is not None and self.pp > layers:
            raise ValueError(f"pp ({self.pp}) cannot exceed the number of layers ({layers}): a stage needs a layer.")


@dataclass(frozen=True)
class Coordinates:
    dp: int
    pp: int
    tp: int
    cp: int = 0


def coordinates(dims: ParallelDims, rank: int) -> Coordinates:
    """Rank -> its coordinate along each dimension (the mixed-radix digits of ``ORDER``, TP innermost)."""
    if not 0 <= rank < dims.world_size:
        raise ValueError(f"rank {rank} is outside a world of {dims.world_size}.")
    digits = {}
    for name in reversed(ORDER):
        rank, digits[name] = divmod(rank, getattr(dims, name))
    return Coordinates(**digits)


def rank_of(dims: ParallelDims, *coords: int, **named: int) -> int:
    """The rank at the given coordinates (positionally in ``ORDER``, or by name)."""
    named = {**dict(zip(ORDER, coords, strict=False)), **named}
    rank = 0
    for name in ORDER:
        rank = rank * getattr(dims, name) + named[name]
    return rank


def groups_along(dims: ParallelDims, *names: str) -> list[list[int]]:
    """Every group of the dimensions ``names``: the ranks that differ only in those coordinates (in rank
    order), one group per combination of the others (outermost first)."""
    others = [n for n in ORDER if n not in names]
    inside = [n for n in ORDER if n in names]
    out = []
    for fixed in itertools.product(*(range(getattr(dims, n)) for n in others)):
        at = dict(zip(others, fixed, strict=True))
        out.append(sorted(rank_of(dims, **at, **dict(zip(inside, free, strict=True)))
                          for free in itertools.product(*(range(getattr(dims, n)) for n in inside))))
    return out


def layout(dims: ParallelDims) -> dict[str, list[list[int]]]:
    """Every group of each kind as its list of global ranks: one kind per dimension of ``ORDER`` (cp only
    when cp > 1), "dp_cp" (data and context together: where gradients are reduced and ZeRO shards when
    cp > 1) and "embed" (Megatron's embedding group): the first and the last pipeline rank of each other
    coordinate, which hold the input embedding and the LM head — tied weights' gradients are summed over it
    (one rank when pp = 1); with ep > 1, "ep" and "edp" (``ParallelDims.ep``); with replicate > 1, "dp_shard" and
    "dp_replicate" (``ParallelDims.replicate``)."""
    names = [n for n in reversed(ORDER) if n != "cp" or dims.cp > 1]  # tp, (cp,) pp, dp: the order groups are made
    out = {name: groups_along(dims, name) for name in names}
    if dims.cp > 1:
        out["dp_cp"] = groups_along(dims, "dp", "cp")
    out["embed"] = [sorted({g[0], g[-1]}) for g in out["pp"]]
    if dims.ep > 1:  # within each data x context group: EP groups of consecutive ranks, EDP groups across them
        base = out.get("dp_cp", out["dp"])
        out["ep"] = [g[i:i + dims.ep] for g in base for i in range(0, len(g), dims.ep)]
        out["edp"] = [g[j::dims.ep] for g in base for j in range(dims.ep)]
    if dims.replicate > 1:  # within each data x context group: shard groups of consecutive ranks, replicas across
        base, shard = out.get("dp_cp", out["dp"]), dims.dp * dims.cp // dims.replicate
        out["dp_shard"] = [g[i:i + shard] for g in base for i in range(0, len(g), shard)]
        out["dp_replicate"] = [g[j::shard] for g in base for j in range(shard)]
    return out


def build_groups(dims: ParallelDims, rank: int) -> dict:
    """This rank's process groups {"tp", "pp", "dp", "embed"} (and "cp", "dp_cp" when cp > 1), created
    collectively (every rank calls this)."""
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
