"""A mixed-precision 3D trainer resumes exactly: the checkpoint holds its fp32 masters and their Adam
state (harness/resume/mixed.py) — resumed on its own layout it continues bitwise as if never stopped
(masters, bf16 parameters, steps done); resumed on another layout (of another ZeRO stage and schedule)
every rank's masters are the saved fp32 values and its bf16 parameters those rounded; a float64 trainer
refuses the checkpoint in one sentence (the store's dtype check)."""

from __future__ import annotations

import pytest

from harness.resume import mixed
from harness.runtime.capabilities import require_dtype


@pytest.mark.parametrize("a, zero_a, b, zero_b", [((2, 1, 2), 2, (1, 2, 2), 1), ((1, 2, 2), 0, (4, 1, 1), 2)],
                         ids=["2x1x2-zero2-to-1x2x2-zero1", "1x2x2-zero0-to-4x1x1-zero2"])
def test_mixed_precision_trainer_resumes_exactly(a, zero_a, b, zero_b, world_cache, tmp_path):
    require_dtype(world_cache.get(4), "bfloat16")
    per_rank = world_cache.get(4).run(mixed.resume_mixed, str(tmp_path), a, zero_a, b, zero_b, timeout=300)
    problems = [p for r in per_rank for p in r["problems"]]
    assert not problems, problems[:4]
    assert all(r["steps_done"] == 2 for r in per_rank)
    refused = {r["float64_refused"] for r in per_rank}  # one sentence, on every rank (the tensor named varies)
    assert all(s and s.endswith("is stored as float32; float64 was asked for.") for s in refused), refused
