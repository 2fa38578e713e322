"""The third-party side of resume: the torch 3D stack (DTensor TP + pipelining + FSDP2) saved with
torch.distributed.checkpoint on one layout and loaded on another (the pipeline split and the world size
change with it), trained on, against one device — the same oracle as ours."""

from __future__ import annotations

import pytest

from harness.resume import torch_dcp

PAIRS = [(((1, 2, 2), "1f1b"), ((2, 1, 2), "gpipe")),   # pp 2 -> 1, dp 1 -> 2, FSDP2 across the new dp
         (((2, 2, 2), "gpipe"), ((1, 1, 2), "1f1b"))]   # 8 ranks -> 2


def _n(dims):
    return dims[0] * dims[1] * dims[2]


@pytest.mark.parametrize("a, b", PAIRS, ids=lambda x: f"{'x'.join(map(str, x[0]))}-{x[1]}")
def test_dcp_resume_on_another_layout_equals_one_device(a, b, world_cache, tmp_path, conformance):
    path = str(tmp_path / "dcp")
    assert world_cache.get(_n(a[0])).run(torch_dcp.train_and_save, path, *a, 2, timeout=300)[0]["refused"] is None
    per_rank = world_cache.get(_n(b[0])).run(torch_dcp.resume_and_compare, path, *b, 2, 2, timeout=300)
    errors = [r["error"] for r in per_rank if r["error"]]
    problems = errors + [p for r in per_rank for p in r["problems"]]
    conformance.record("fail" if problems else "pass", suite="resume", world_size=_n(b[0]), dtype="float64",
                       collective=f"{a} -> {b}", impl="torch",
                       max_rel_err=max(r.get("worst") or 0.0 for r in per_rank), detail=" | ".join(problems[:1]))
    assert not problems, problems[:4]
