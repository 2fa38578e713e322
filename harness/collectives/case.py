"""One collectives conformance case: its inputs, its exact expected output, and its check on a rank.

Inputs are integer-valued, depend on the group rank AND the element index, and are bounded so that
every partial result is exactly representable in the dtype (DESIGN.md, "Oracles"): |x| <= L // N for
sum/avg with L the dtype's largest exact integer (float16 2048, bfloat16 256, float32 2^24, ...),
|x| <= 2 for product (|result| <= 2^N), and any reduction order then gives the same bits. Each rank
computes the expected result itself from the same formula: there is no communication in the oracle.
AVG is held to at most 1 ulp of the exact quotient (one rounding, in whatever order the sum ran).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from harness.records import registry
from harness.runtime.rank import failed_in_implementation

from ..errors import describe

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")
REDUCING = ("all_reduce", "reduce_scatter", "reduce")
ROOTED = {"broadcast": "src", "reduce": "dst"}
IN_PLACE_OPTIONAL = ("reduce_scatter", "all_gather", "all_to_all")
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")
OPS = ("sum", "avg", "max", "min", "product")

# Largest integer up to which every integer is exactly representable (2^(mantissa bits + 1)).
_EXACT = {"float16": 2**11, "bfloat16": 2**8, "float32": 2**24, "float64": 2**53,
          "int32": 2**31 - 1, "int64": 2**63 - 1}
_MANTISSA = {"float16": 10, "bfloat16": 7, "float32": 23, "float64": 52}
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_POISON = 77  # what output buffers hold before the call: an untouched element shows up as wrong
_MAX_BOUND = 2**30  # keeps the generator's arithmetic inside int64


@dataclass(frozen=True)
class Case:
    """One collective call. ``numel`` is the tensor's size for all_reduce/broadcast/reduce, the
    per-rank block (output of reduce_scatter, input of all_gather, one peer's block of all_to_all)
    otherwise. ``group`` lists the global ranks of a subgroup (None: the world); ``root`` is a rank
    within it."""

    impl: str
    collective: str
    dtype: str = "float32"
    numel: int = 1
    op: str = "sum"
    root: int = 0
    in_place: bool = False
    group: tuple[int, ...] | None = None
    seed: int = 0

    def line(self, world_size: int) -> str:
        """The case as one readable line (what a failure prints after shrinking)."""
        op = self.op if self.collective in REDUCING else "-"
        root = self.root if self.collective in ROOTED else "-"
        in_place = self.in_place if self.collective in IN_PLACE_OPTIONAL else "-"
        group = "world" if self.group is None else "ranks " + ",".join(map(str, self.group))
        return (f"impl={self.impl} collective={self.collective} op={op} world_size={world_size} "
                f"dtype={self.dtype} numel={self.numel} root={root} in_place={in_place} "
                f"group={group} seed={self.seed}")

    def as_row(self) -> dict:
        row = asdict(self)
        row["group"] = "" if self.group is None else ",".join(map(str, self.group))
        return row


def bound(case: Case, n: int) -> int:
    """The largest |input| that keeps every partial result of this case exact (see module doc)."""
    limit = min(_EXACT[case.dtype], _MAX_BOUND)
    if case.collective in REDUCING and case.op == "product":
        return 2
    if case.collective in REDUCING and case.op in ("sum", "avg"):
        return max(1, limit // n)
    return limit


def inputs(case: Case, group_rank: int, n: int, count: int, wide=torch.int64, start: int = 0) -> torch.Tensor:
    """Rank ``group_rank``'s integer-valued input (as ``wide``) at indices ``start`` .. ``start + count``, a
    function of rank, index and seed: ``(i * 2654435761 + (rank + 1) * 40503 + seed * 97 + (i * (rank + 3)) % 13)
    mod (2 b + 1) - b`` (in place, in int64: the 64 MiB benchmark sizes check in a third of the time)."""
    b = bound(case, n)
    idx = torch.arange(start, start + count, dtype=torch.int64)
    # (i * (rank + 3)) % 13 repeats every 13 indices: tiled from its first period instead of divided out
    period = (torch.arange(start, start + 13, dtype=torch.int64) * (group_rank + 3)).remainder_(13)
    mixed = period.repeat(-(-count // 13))[:count]
    mixed.add_(idx, alpha=2654435761).add_((group_rank + 1) * 40503 + case.seed * 97)
    return mixed.remainder_(2 * b + 1).sub_(b).to(wide)


def _reduced(case: Case, n: int, count: int, wide, start: int = 0) -> torch.Tensor:
    """The reduction over every group rank of their inputs at ``start`` .. ``start + count``, accumulated in
    place (exact in any order: the inputs are bounded so that every partial result is representable)."""
    total = inputs(case, 0, n, count, wide, start)
    for q in range(1, n):
        x = inputs(case, q, n, count, wide, start)
        if case.op in ("sum", "avg"):
            total.add_(x)
        elif case.op == "max":
            torch.maximum(total, x, out=total)
        elif case.op == "min":
            torch.minimum(total, x, out=total)
        else:
            total.mul_(x)
    return total


_LAST_EXPECTED: dict = {}  # the last expected output computed on this rank, by everything it depends on


def expected(case: Case, group_rank: int, n: int) -> torch.Tensor:
    """What this rank's output must hold, computed locally: int64 for integer dtypes, float64 for
    floating ones (exact for these bounded integers, and IEEE-signed: a product with a zero and an odd
    number of negative factors is -0.0 in any order), the float64 quotient for AVG. The last one is kept (read
    only; the implementation is not part of it): the benchmark checks every implementation of a collective at
    one size in a row, and at 64 MiB each computation reads n ranks' inputs."""
    key = (case.collective, case.dtype, case.op, case.root, case.numel, case.seed, group_rank, n)
    if key not in _LAST_EXPECTED:
        _LAST_EXPECTED.clear()
        _LAST_EXPECTED[key] = _expected(case, group_rank, n)
    return _LAST_EXPECTED[key]


def _expected(case: Case, group_rank: int, n: int) -> torch.Tensor:
    c, r = case.numel, group_rank
    wide = torch.int64 if case.dtype.startswith("int") else torch.float64
    if case.collective == "all_reduce" or case.collective == "reduce":
        total = _reduced(case, n, c, wide)
    elif case.collective == "reduce_scatter":  # my block of every rank's input
        total = _reduced(case, n, c, wide, start=r * c)
    elif case.collective == "broadcast":
        return inputs(case, case.root, n, c, wide)
    elif case.collective == "all_gather":
        return torch.cat([inputs(case, q, n, c, wide) for q in range(n)])
    else:  # all_to_all: block q of my output is block r of rank q's input
        return torch.cat([inputs(case, q, n, c, wide, start=r * c) for q in range(n)])
    return total.double() / n if case.op == "avg" else total


def compare(got: torch.Tensor, want: torch.Tensor, case: Case) -> tuple[int, str]:
    """(number of wrong elements, one-line description of the first); bitwise except AVG (<= 1 ulp)."""
    got = got.reshape(-1).cpu()
    if case.op == "avg" and case.collective in REDUCING:
        exact = want.double()
        mag = exact.abs().clamp_min(torch.finfo(torch.float64).tiny)
        ulp = torch.exp2(torch.floor(torch.log2(mag)) - _MANTISSA[case.dtype])
        bad = (got.double() - exact).abs() > torch.where(exact == 0, torch.zeros_like(ulp), ulp)
    else:
        want = want.to(got.dtype)
        if got.dtype.is_floating_point:
            bits = _BITS[got.element_size()]
            bad = got.view(bits) != want.view(bits)
        else:
            bad = got != want
    wrong = int(bad.sum())
    if not wrong:
        return 0, ""
    i = int(bad.nonzero()[0])
    return wrong, (f"{wrong} of {got.numel()} elements wrong, first at [{i}]: "
                   f"got {got[i].item()!r}, expected {want[i].item()!r}")


_GROUPS: dict[tuple[int, ...], object] = {}


def _group(ranks: tuple[int, ...] | None):
    """The process group for ``ranks`` (created once per rank process; every rank must ask)."""
    import torch.distributed as dist

    if ranks is None:
        return None
    if ranks not in _GROUPS:
        _GROUPS[ranks] = dist.new_group(list(ranks))
    return _GROUPS[ranks]


def make_buffers(case: Case, group_rank: int, n: int, device, zeros: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, input) tensors for this rank, filled per the case (``zeros``: every element 0, the benchmark's
    timed buffers: zeros stay zeros under every op); equal objects when in place."""
    dtype = getattr(torch, case.dtype)
    c, r = case.numel, group_rank

    def filled(count: int) -> torch.Tensor:
        return (torch.zeros(count, dtype=dtype, device=device) if zeros else
                inputs(case, r, n, count).to(dtype).to(device))

    poison = 0 if zeros else _POISON
    if case.collective in ("all_reduce", "broadcast", "reduce"):
        t = filled(c)
        return t, t
    big = n * c
    if case.collective == "all_gather":
        out = torch.full((big,), poison, dtype=dtype, device=device)
        if case.in_place:
            out[r * c:(r + 1) * c] = filled(c)
            return out, out[r * c:(r + 1) * c]
        return out, filled(c)
    inp = filled(big)
    if case.in_place:  # reduce_scatter: output is my block of input; all_to_all: output is input
        return (inp[r * c:(r + 1) * c] if case.collective == "reduce_scatter" else inp), inp
    size = c if case.collective == "reduce_scatter" else big
    return torch.full((size,), poison, dtype=dtype, device=device), inp


def call(impl, case: Case, out: torch.Tensor, inp: torch.Tensor, group) -> None:
    """Invoke the case's collective on ``impl`` through the contract."""
    name = case.collective
    if name == "all_reduce":
        impl.all_reduce(out, op=case.op, group=group)
    elif name == "broadcast":
        impl.broadcast(out, case.root, group=group)
    elif name == "reduce":
        impl.reduce(out, case.root, op=case.op, group=group)
    elif name == "reduce_scatter":
        impl.reduce_scatter(out, inp, op=case.op, group=group)
    elif name == "all_gather":
        impl.all_gather(out, inp, group=group)
    elif name == "all_to_all":
        impl.all_to_all(out, inp, group=group)
    else:
        raise ValueError(f"collective must be one of {', '.join(COLLECTIVES)}; got {name!r}.")


def run_case(case: Case) -> dict:
    """Rank side: build this rank's buffers, run the collective, check it. Returns
    {"outcome": "pass" | "fail" | "unsupported" | "error" | "idle", "wrong": int, "detail": str, "bytes_sent"}
    ("raised": True where the fail is the implementation's exception): whatever the implementation does is pass /
    fail / unsupported; "error" is a failure of the oracle itself."""
    import torch.distributed as dist

    from harness.runtime.world import rank_device

    group = _group(case.group)
    me = dist.get_rank()
    if case.group is not None and me not in case.group:
        return {"outcome": "idle", "wrong": 0, "detail": "", "bytes_sent": 0}
    r = dist.get_rank(group)
    n = dist.get_world_size(group)
    impl = registry.load(case.impl, "collectives")
    out, inp = make_buffers(case, r, n, rank_device())
    try:
        call(impl, case, out, inp, group)
    except NotImplementedError as exc:  # Unsupported included
        return {"outcome": "unsupported", "wrong": 0, "detail": str(exc), "bytes_sent": 0}
    except Exception as exc:  # noqa: BLE001 - whatever the code under test raises is its verdict, not ours
        return {"outcome": "fail", "wrong": 0, "bytes_sent": 0, "raised": True,
                "detail": failed_in_implementation(f"rank {me}: raised {describe(exc)}")}
    if case.op == "avg" and case.collective in REDUCING and not out.dtype.is_floating_point:
        return {"outcome": "fail", "wrong": 0, "bytes_sent": 0,
                "detail": f"rank {me}: accepted AVG on {case.dtype}, which the contract leaves out (AVG is for "
                          "floating dtypes only): raise Unsupported"}
    try:
        if case.collective == "reduce" and r != case.root:
            wrong, detail = 0, ""  # only dst's tensor is specified
        else:
            wrong, detail = compare(out, expected(case, r, n), case)
    except Exception as exc:  # noqa: BLE001 - the oracle's own failure: a harness error, not the implementation's
        return {"outcome": "error", "wrong": 0, "bytes_sent": 0,
                "detail": f"rank {me}: harness error in the oracle: {describe(exc)}"}
    return {"outcome": "fail" if wrong else "pass", "wrong": wrong,
            "detail": f"rank {me}: {detail}" if detail else "", "bytes_sent": getattr(impl, "bytes_sent", None)}


def merge(results: list[dict]) -> dict:
    """Driver side: one verdict from every rank's result (a harness error first, then any failure; idle
    ranks are ignored)."""
    active = [r for r in results if r["outcome"] != "idle"]
    for outcome in ("error", "fail", "unsupported"):
        hit = [r for r in active if r["outcome"] == outcome]
        if hit:
            return {"outcome": outcome, "wrong": sum(r["wrong"] for r in active),
                    "detail": "; ".join(dict.fromkeys(r["detail"] for r in hit if r["detail"]))}
    return {"outcome": "pass", "wrong": 0, "detail": ""}


__all__ = ["COLLECTIVES", "Case", "DTYPES", "OPS", "bound", "compare", "expected", "inputs",
           "make_buffers", "merge", "run_case"]
