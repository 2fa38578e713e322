"""Index arithmetic of the resume format: a flat range of a C-ordered tensor as boxes."""

from __future__ import annotations

import math


def flat_range_to_boxes(shape, start: int, stop: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The elements [start, stop) of a C-ordered tensor of ``shape`` as (offsets, lengths) boxes, in order:
    a partial first row, the whole rows between, a partial last row (recursively per dimension). A ZeRO
    shard is such a range of its flat buffer; its piece of each parameter becomes at most 2 d - 1 boxes."""
    shape = tuple(shape)
    if start >= stop:
        return []
    if len(shape) <= 1:
        return [((start,), (stop - start,))] if shape else [((), ())]
    inner = math.prod(shape[1:])
    first, last = start // inner, (stop - 1) // inner
    if first == last:
        return [((first, *o), (1, *n)) for o, n in flat_range_to_boxes(shape[1:], start - first * inner,
                                                                         stop - first * inner)]
    out = []
    whole_from, whole_to = -(-start // inner), stop // inner
    if start % inner:
        out += [((first, *o), (1, *n)) for o, n in flat_range_to_boxes(shape[1:], start - first * inner, inner)]
    if whole_to > whole_from:
        out.append(((whole_from,) + (0,) * (len(shape) - 1), (whole_to - whole_from, *shape[1:])))
    if stop % inner:
        out += [((last, *o), (1, *n)) for o, n in flat_range_to_boxes(shape[1:], 0, stop - last * inner)]
    return out
