"""Resume anywhere: the reference 3D stack trained 2 steps on layout A, saved, loaded on layout B, trained
2 more steps equals 4 steps on one device (float64, the 3D suite's bound; Adam adds the allowance derived
in case.Recipe.allowance), every rank of B compared. Pairs change the world size (1 -> 4, 4 -> 4, 8 -> 2,
2 -> 8), dp <-> pp <-> tp, the ZeRO stage (0 <-> 1 <-> 2) and the schedule; tp = 2 and 4 pad the 13-word
vocabulary; the last pair ties the embedding to the LM head (first and last stage on A, one rank's two copies
on B). Dropout is on in every pair (keyed masks: the RNG state is (seed, step), see
reference.dropout); two pairs train Adam (moments and step count resharded), one of them with a dynamic
loss scaler whose state (scale, growth tracker) must come back: it grows every 3 steps, so a fresh
scaler after the resume would differ from one device's. A rank killed mid-save leaves the previous step,
which resumes exactly."""

from __future__ import annotations

import pytest

from harness.resume import case
from harness.resume.case import Recipe
from harness.runtime.world import RankFailure

DROP, ADAM, SCALED = Recipe(0.1), Recipe(0.1, "adam"), Recipe(0.1, "adam", growth_interval=3)
PAIRS = [  # (A dims, schedule, zero) -> (B dims, schedule, zero), recipe
    (((2, 1, 2), "1f1b", 1), ((1, 2, 2), "gpipe", 0), DROP),
    (((1, 2, 2), "1f1b", 0), ((4, 1, 1), "1f1b", 2), ADAM),
    (((1, 1, 1), "1f1b", 0), ((1, 2, 2), "interleaved", 1), DROP),
    (((2, 2, 2), "1f1b", 2), ((1, 1, 2), "gpipe", 1), SCALED),
    (((1, 2, 1), "gpipe", 1), ((2, 1, 4), "1f1b", 0), Recipe(0.1, tie=True)),
]


def _id(x):
    if isinstance(x, Recipe):
        return f"{x.optimizer}{'-scaler' if x.growth_interval else ''}{'-tied' if x.tie else ''}"
    return f"{'x'.join(map(str, x[0]))}-{x[1]}-zero{x[2]}"


def _n(dims):
    return dims[0] * dims[1] * dims[2]


@pytest.mark.parametrize("a, b, recipe", PAIRS, ids=_id)
def test_resume_on_another_layout_equals_one_device(a, b, recipe, world_cache, tmp_path, conformance):
    world_cache.get(_n(a[0])).run(case.train_and_save, str(tmp_path), *a, 2, 0, None, recipe, timeout=300)
    per_rank = world_cache.get(_n(b[0])).run(case.resume_and_compare, str(tmp_path), *b, 2, 0, recipe,
                                             timeout=300)
    problems = [p for r in per_rank for p in r["problems"]]
    conformance.record("fail" if problems else "pass", suite="resume", world_size=_n(b[0]), dtype="float64",
                       collective=f"{a} -> {b} {_id(recipe)}", impl="reference",
                       max_rel_err=max(r["worst"] for r in per_rank), detail=" | ".join(problems[:1]))
    assert all(r["step"] == 2 for r in per_rank) and not problems, problems[:4]


def test_a_checkpoint_of_an_untied_model_is_refused_by_a_tied_one(world_cache, tmp_path):
    world_cache.get(1).run(case.train_and_save, str(tmp_path), (1, 1, 1), "1f1b", 0, 1, timeout=300)
    got = world_cache.get(1).run(case.resume_and_compare, str(tmp_path), (1, 1, 1), "1f1b", 0, 1, 0,
                                 Recipe(tie=True), timeout=300)[0]
    assert got["refused"] == (f"{tmp_path}/step-1/metadata.json is from an untied model, and this trainer's model "
                              "ties its embedding to its LM head.")


def test_a_layout_the_model_cannot_take_is_one_sentence(world_cache, tmp_path):
    world_cache.get(2).run(case.train_and_save, str(tmp_path), (1, 1, 2), "1f1b", 0, 1, timeout=300)
    refused = world_cache.get(3).run(case.resume_and_compare, str(tmp_path), (1, 1, 3), "1f1b", 0, 1, timeout=300)
    assert all(r["refused"] == "tp (3) must divide the attention heads (8)." for r in refused)


def test_a_rank_killed_mid_save_leaves_the_previous_step(world_cache, tmp_path):
    with pytest.raises(RankFailure, match="rank"):
        world_cache.get(4).run(case.train_and_save, str(tmp_path), (2, 1, 2), "1f1b", 1, 2, 0, (3, 1), timeout=300)
    assert (tmp_path / "latest").read_text().strip() == "step-2"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".staging-step-3")]  # the torn save, unread
    per_rank = world_cache.get(2).run(case.resume_and_compare, str(tmp_path), (1, 2, 1), "1f1b", 0, 2, timeout=300)
    assert all(r["step"] == 2 and not r["problems"] for r in per_rank), per_rank[0]["problems"]
