"""The 3D trainer's own refusals, each one sentence: clipping arguments it cannot take, a layout the model cannot
split. Its conformance — every layout of 1-8 ranks with the tie, keyed dropout, clipping and accumulation, 2 x 2 x 2
under every combination, the planted bugs — is the stack suite's (suites/stack/test_equivalence.py and
test_reference_corners.py: one reference trainer, one oracle)."""

from __future__ import annotations

import pytest

from harness.threed import case as ranks
from reference.models import GPT
from reference.stack.topology import ParallelDims

MODEL = GPT()


def test_bad_clipping_arguments_are_one_sentence(world_cache):
    from reference.clipping import grad_norm

    with pytest.raises(ValueError, match="norm_type must be 2 or inf; got 1.0"):
        grad_norm([], {}, 1.0)
    refused = world_cache.get(1).run(ranks.train_3d, 1, 1, 1, "1f1b", 0, False, 1, 0, 0.1, [(0.0, 2.0)],
                                     timeout=300)[0]["refused"]
    assert refused == "max_grad_norm must be positive; got 0.0."


def test_invalid_layouts_are_one_sentence(world_cache):
    refused = world_cache.get(8).run(ranks.train_3d, 1, 8, 1, "1f1b", 0, False, timeout=300)[0]["refused"]
    assert refused == "pp (8) cannot exceed the number of layers (4): a stage needs a layer."
    refused = world_cache.get(2).run(ranks.train_3d, 1, 2, 1, "interleaved", 0, False, timeout=300)[0]["refused"]
    assert refused is None  # 2 x 2 virtual stages = 4 layers: fits
    refused = world_cache.get(4).run(ranks.train_3d, 1, 4, 1, "interleaved", 0, False, timeout=300)[0]["refused"]
    assert refused == "pp x virtual stages = 8 cannot exceed the number of layers (4)."
    with pytest.raises(ValueError, match=r"dp x pp x tp = 2 x 2 x 1 = 4 must equal the world size \(8\)"):
        ParallelDims(2, 2, 1).check(8)
    with pytest.raises(ValueError, match=r"tp \(3\) must divide the attention heads \(8\)"):
        ParallelDims(1, 1, 3).check(3, heads=8)
    with pytest.raises(ValueError, match="dp must be a whole number >= 1; got 0"):
        ParallelDims(0, 1, 1)
