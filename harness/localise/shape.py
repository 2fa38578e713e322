"""The shape of a difference: the first diverging tensor's items (every rank's, every call's) classified by the
signature most parallel bugs leave, and said in words. Rules, tried in this order (the first that holds wins):

``nonfinite``  a NaN / inf where one device is finite: where it first appears;
``zeroed``     every element off is exactly 0 where one device's is not: a block zeroed or left stale (a dropped
               remainder, a missing gather; in an update, a parameter not updated);
``decay``      an update off by exactly lr x weight_decay x the parameter (AdamW): a decay where one device's rule
               spares the parameter, or none where it decays it;
``schedule``   an update f x one device's with f a ratio of the recipe's learning-rate schedule: the update at another
               position's lr (a scheduler stepped early, late or per micro-step) or at the base lr (none applied);
``sign``       got = -want everywhere;
``factor``     got = f x want everywhere, f a group's size or its inverse (an extra sum or a missing average over
               that group, or the reverse) — or another uniform factor, named as such;
``partial``    ranks holding the same slice each hold a part, and their sum is one device's (a missing sum);
``offset``     under cp, right exactly where a rank's local position equals the global one (a position offset:
               rotary or the mask applied at local positions);
``permuted``   the blocks along a dimension (as many as a group has ranks) are one device's in another order;
``one-rank``   right on some ranks of a group, wrong on the others;
``none``       none of these: the magnitude only.
"""

from __future__ import annotations

import math

import torch

from .compare import coords_of

ORDER = ("ep", "cp", "tp", "pp", "accumulation steps", "dp", "dp x cp", "micro-batches", "ranks")
"""Which group a factor is named after first, where several have its size: the most specific first."""
NOUN = {"accumulation steps": "the accumulation steps", "micro-batches": "the micro-batches", "ranks": "every rank"}
SIZE = {"accumulation steps": "the number of accumulation steps", "micro-batches": "the number of micro-batches",
        "ranks": "the number of ranks"}


def sizes(layout, recipe) -> dict[str, int]:
    """{group: its size} of the case's groups larger than one."""
    out = {"ep": layout.ep, "cp": layout.cp, "tp": layout.tp, "pp": layout.pp,
           "accumulation steps": recipe.accumulation, "dp": layout.dp,
           "dp x cp": layout.dp * layout.cp if layout.dp > 1 and layout.cp > 1 else 1,
           "micro-batches": layout.num_microbatches, "ranks": layout.world_size}
    return {k: v for k, v in out.items() if v > 1}


def _flat(items, what):
    return torch.cat([getattr(i, what).flatten() for i in items]) if items else torch.zeros(0)


def nonfinite(items, layout, recipe):
    bad = [i for i in items if not bool(torch.isfinite(i.got).all())]
    if not bad:
        return None
    first = min(bad, key=lambda i: i.key)
    count = int((~torch.isfinite(first.got)).sum())
    return (f"NaN / inf where one device is finite: first here, on rank {first.rank} (call {first.call}): {count} of "
            f"{first.got.numel()} elements")


def zeroed(items, layout, recipe):
    off = [i for i in items if i.off]
    if not off or not all(bool(torch.isfinite(i.got).all()) for i in off):
        return None
    for i in off:
        wrong = (i.got - i.want).abs() > i.limit
        if not bool((i.got[wrong] == 0).all()):
            return None
    first = min(off, key=lambda i: i.key)
    where = _zero_region(first)
    what = "not updated (left stale)" if first.phase == "update" else "a block zeroed"
    return f"{what}: {where} — a dropped remainder, a missing gather or copy"


def _zero_region(item) -> str:
    wrong = (item.got - item.want).abs() > item.limit
    if wrong.dim() >= 2 and bool((wrong.any(-1) == wrong.all(-1)).all()) and "tokens" in item.meta:
        vectors = wrong.any(-1)
        if item.meta.get("batch_dim") == 1:
            vectors = vectors.transpose(0, 1)
        tokens = item.meta["tokens"][vectors].unique().tolist()
        plural = "s" if len(tokens) > 1 else ""
        said = f", all at token{plural} {', '.join(map(str, tokens))}" if len(tokens) <= 3 else ""
        return (f"whole vectors zero at {int(vectors.sum())} of {vectors.numel()} (row, position) pairs on rank "
                f"{item.rank}{said}")
    rows = wrong.flatten(1).any(1) if wrong.dim() >= 2 else wrong
    idx = rows.nonzero().flatten().tolist()
    if idx and idx == list(range(idx[0], idx[-1] + 1)):
        span = f"row {idx[0]}" if len(idx) == 1 else f"rows {idx[0]}-{idx[-1]}"
        return f"{span} of {rows.numel()} along dimension 0 on rank {item.rank}"
    return f"{int(wrong.sum())} of {wrong.numel()} elements on rank {item.rank}"


def decay(items, layout, recipe):
    opt = recipe.optimizer
    off = [i for i in items if i.off and i.phase == "update" and i.meta.get("before") is not None]
    if opt.name != "adamw" or not opt.weight_decay or not off:
        return None
    d = opt.lr * opt.weight_decay
    for extra in (True, False):  # decoupled: p' = (1 - d) p - u, so one decay too many moves the update by -d p
        moved = [-d * i.meta["before"] if extra else d * i.meta["before"] for i in off]
        if all(float((i.got - i.want - m).abs().max()) <= i.limit for i, m in zip(off, moved, strict=True)):
            which = ("decayed where one device's AdamW spares it (its rule: " + opt.decay + ")" if extra else
                     "not decayed where one device's AdamW decays it")
            return (f"an update off by exactly {'-' if extra else ''}lr x weight_decay x the parameter ({d:g}): "
                    f"the parameter {which}")
    return None


def schedule(items, layout, recipe):
    plan = recipe.lr_schedule
    off = [i for i in items if i.off and i.phase == "update"]
    if plan is None or not off or len({i.step for i in off}) != 1:
        return None
    f, s = _factor(off), off[0].step - 1  # the update of step k is taken after s = k - 1 updates
    want = plan.factor(s)
    if f is None or want == 0 or abs(f - 1) < 1e-9:
        return None
    tol = max(1e-6, 100 * max(i.bound for i in off))
    said = []
    for other in range(max(4 * (s + 1), plan.total or 0, plan.warmup + plan.stable) + 2):
        if other != s and abs(f * want - plan.factor(other)) <= tol * max(1.0, plan.factor(other)):
            lead = abs(other - s)
            way = "ahead" if other > s else "behind"
            per = f" ({other // s} positions per update: stepped per micro-step?)" if s and other % s == 0 and \
                other > s else ""
            said.append(f"position {other}'s lr: the scheduler {lead} update{'s' * (lead > 1)} {way}{per}")
            break
    if abs(f * want - 1) <= tol:
        said.append("the optimizer's base lr: the schedule not applied to this parameter's group")
    if not said:
        return None
    return f"an update x {f:.4g} one device's, which steps at the schedule's lr of position {s}: at " + \
        " — or ".join(said)


def _factor(items):
    g, w = _flat(items, "got"), _flat(items, "want")
    ww = float((w * w).sum())
    if ww == 0 or not bool(torch.isfinite(g).all()):
        return None
    f = float((g * w).sum()) / ww
    tol = max(i.limit for i in items)
    return f if float((g - f * w).abs().max()) <= tol * max(1.0, abs(f)) else None


def factor(items, layout, recipe):
    f = _factor(items)
    if f is None or abs(f - 1) < 1e-9:
        return None
    if abs(f + 1) <= 1e-6:
        return "a sign flip: every element is one device's negated"
    tol = max(1e-6, 100 * max(i.bound for i in items))
    groups = sizes(layout, recipe)
    for inverse in (False, True):
        names = [g for g in ORDER
                 if g in groups and abs(f - (1 / groups[g] if inverse else groups[g])) <= tol * max(1, f)]
        if names:
            g, n = names[0], groups[names[0]]
            size, noun = SIZE.get(g, f"the size of {g}"), NOUN.get(g, f"the {g} group")
            others = [x for x in names[1:] if x not in ("micro-batches", "ranks")]
            also = f" (as is {' and '.join(SIZE.get(x, f'the size of {x}') for x in others)})" if others else ""
            if inverse:
                return f"an exact factor 1/{n} = 1 / {size}{also}: a missing sum over {noun} (or an extra average)"
            return f"an exact factor {n} = {size}{also}: an extra sum over {noun} (or a missing average)"
    return f"a uniform factor {f:.6g}: the size of no group here"


def per_part(items, layout, recipe):
    off = [i for i in items if i.off]
    factors = {}
    for i in items:
        f = _factor([i])
        if f is None and not i.off and not bool(i.want.any()):  # zero by structure (an all-padding micro-batch)
            continue
        if f is None:
            return None
        factors[(i.rank, i.call)] = f
    distinct = sorted({round(f, 6) for f in factors.values()})
    if not off or len(distinct) < 2:
        return None
    parts = ", ".join(f"{f:.4g}" for f in distinct)
    return (f"each micro-batch or rank scaled by its own factor ({parts}): a loss normalised per part (its own "
            "counted targets) where the whole batch's count was meant")


def _differ(layout, ranks) -> list[str]:
    cs = [coords_of(layout, r) for r in ranks]
    return [d for d in ("dp", "pp", "cp", "tp") if len({getattr(c, d) for c in cs}) > 1]


def partial(items, layout, recipe):
    off = [i for i in items if i.off]
    for first in sorted(off, key=lambda i: i.key):
        same = [i for i in items if i.call == first.call and i.step == first.step and i.want.shape == first.want.shape
                and torch.equal(i.want, first.want)]
        ranks = sorted({i.rank for i in same})
        if len(ranks) < 2:
            continue
        total = sum(i.got for i in same)
        if float((total - first.want).abs().max()) <= first.limit * len(same):
            group = " x ".join(_differ(layout, ranks)) or "ranks"
            return (f"each of ranks {', '.join(map(str, ranks))} holds a part and their sum is one device's: a missing "
                    f"sum over {group}")
    return None


def offset(items, layout, recipe):
    placed = [i for i in items if i.meta.get("positions") is not None]
    if not placed or layout.cp < 2:
        return None
    right_somewhere = wrong_somewhere = False
    for i in placed:
        sdim = i.meta["seq_dim"]
        err = (i.got - i.want).abs().movedim(sdim, 0).flatten(1).amax(1)
        ok = err <= i.limit
        expected = i.meta["positions"] == torch.arange(len(i.meta["positions"]))
        if not torch.equal(ok, expected):
            return None
        right_somewhere |= bool(expected.any())
        wrong_somewhere |= bool((~expected).any())
    if not (right_somewhere and wrong_somewhere):
        return None
    return ("a position offset: right exactly where a rank's local position equals its global one, wrong at every "
            "other — rotary or the mask applied at the shard's local positions, not the sequence's")


def _swapped(items, layout):
    """{rank: the rank whose slice it holds} where every off item holds another rank's slice of its call, or None."""
    holds = {}
    for i in (i for i in items if i.off):
        other = next((j for j in items if j.rank != i.rank and j.call == i.call and j.step == i.step
                      and j.want.shape == i.want.shape and float((i.got - j.want).abs().max()) <= i.limit), None)
        if other is None:
            return None
        holds[i.rank] = other.rank
    return holds or None


def permuted(items, layout, recipe):
    holds = _swapped(items, layout)
    if holds:
        pairs = ", ".join(f"rank {a} holds rank {b}'s" for a, b in sorted(holds.items()))
        group = " x ".join(_differ(layout, sorted(set(holds) | set(holds.values())))) or "ranks"
        return f"shards in the wrong order across the {group} group: {pairs} slice"
    counts = sorted(set(sizes(layout, recipe).values()) | {2})
    for i in sorted((i for i in items if i.off), key=lambda i: i.key):
        for dim in range(i.got.dim()):
            for k in counts:
                if i.got.shape[dim] % k or i.got.shape[dim] == k and i.got.dim() == 1:
                    continue
                g, w = i.got.chunk(k, dim), i.want.chunk(k, dim)
                perm = [next((j for j in range(k) if float((g[a] - w[j]).abs().max()) <= i.limit), None)
                        for a in range(k)]
                if None not in perm and sorted(perm) == list(range(k)) and perm != list(range(k)):
                    return (f"shards in the wrong order along dimension {dim}: its {k} blocks hold one device's "
                            f"blocks {perm} (rank {i.rank})")
        break
    return None


def one_rank(items, layout, recipe):
    ranks = sorted({i.rank for i in items})
    bad = sorted({i.rank for i in items if i.off})
    good = [r for r in ranks if r not in bad]
    if not good or not bad:
        return None
    cs = {r: coords_of(layout, r) for r in ranks}
    for d in ("tp", "cp", "pp", "dp"):
        if not {getattr(cs[r], d) for r in good} & {getattr(cs[r], d) for r in bad}:
            return (f"right on rank{'s' if len(good) > 1 else ''} {', '.join(map(str, good))} only, wrong on "
                    f"{', '.join(map(str, bad))}: they differ in their {d} coordinate")
    return f"right on ranks {', '.join(map(str, good))}, wrong on {', '.join(map(str, bad))}"


RULES = (("nonfinite", nonfinite), ("zeroed", zeroed), ("decay", decay), ("schedule", schedule),
         ("factor", factor), ("per-part", per_part),
         ("partial", partial), ("offset", offset), ("permuted", permuted), ("one-rank", one_rank))


def classify(items, layout, recipe) -> tuple[str, str]:
    """(the rule's name, the sentence) of the first diverging tensor's ``items``."""
    for name, rule in RULES:
        said = rule(items, layout, recipe)
        if said:
            return ("sign" if said.startswith("a sign flip") else name), said
    first = min((i for i in items if i.off), key=lambda i: i.key)
    rel = "inf" if math.isinf(first.rel) else f"{first.rel:.3g}"
    return "none", f"none of the known shapes: off by {rel} of its magnitude (bound {first.bound:.3g})"
