"""DeepSpeed's checkpoints across a resume (``harness.resume.deepspeed_ckpt``): what loads, what DeepSpeed
refuses, and its universal conversion, each against one device (the data-parallel suite's mlp, float32
bound). Measured with deepspeed 0.19.8 on CPU: same DP size, any stage change 1 -> 2 loads exactly; ZeRO 0
at another DP size loads exactly; ZeRO 1-3 at another DP size is refused by DeepSpeed in one sentence (its
documented route is the universal conversion, which resumes exactly with Adam and fails with SGD: a
finding)."""

from __future__ import annotations

import pytest

pytest.importorskip("deepspeed", reason="deepspeed is not installed (extra paritybench[deepspeed])")

from harness.resume import deepspeed_ckpt as ds  # noqa: E402 - after the skip

CASES = [((2, 1), (2, 2), "pass"), ((2, 0), (4, 0), "pass"), ((2, 2), (4, 2), "refused")]


@pytest.mark.parametrize("a, b, expected", CASES, ids=lambda x: str(x))
def test_deepspeed_checkpoint_across_layouts(a, b, expected, world_cache, tmp_path, conformance):
    path = str(tmp_path / "ds")
    world_cache.get(a[0]).run(ds.save, path, a[1], 2, timeout=300)
    got = world_cache.get(b[0]).run(ds.resume_and_compare, path, b[1], 2, 2, timeout=300)[0]
    conformance.record({"pass": "pass", "fail": "fail", "refused": "unsupported"}[got["outcome"]], suite="resume",
                       world_size=b[0], dtype="float32", collective=f"dp {a[0]} zero {a[1]} -> dp {b[0]} zero {b[1]}",
                       impl="deepspeed", max_rel_err=got.get("worst"), detail=got["detail"])
    assert got["outcome"] == expected, got["detail"]
    if expected == "refused":
        assert "used a DP world size of 2 but the current world size is 4" in got["detail"]


def test_universal_checkpoint_resumes_at_another_dp_size(world_cache, tmp_path):
    path = str(tmp_path / "ds")
    world_cache.get(2).run(ds.save, path, 2, 2, "adam", timeout=300)
    universal = ds.to_universal(path, 2)
    got = world_cache.get(4).run(ds.resume_and_compare, universal, 2, 2, 2, True, "adam", timeout=300)[0]
    assert got["outcome"] == "pass", got["detail"]


def test_universal_conversion_of_an_sgd_checkpoint_fails(world_cache, tmp_path):
    """Watch test of the finding: fails once ds_to_universal converts an SGD checkpoint."""
    path = str(tmp_path / "ds")
    world_cache.get(2).run(ds.save, path, 2, 2, "sgd", timeout=300)
    with pytest.raises(KeyError, match="exp_avg"):
        ds.to_universal(path, 2)
