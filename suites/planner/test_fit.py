"""The fits recover known α, β and rates from synthetic rows (nccl, as a GPU run folder would hold them);
profiles round-trip through JSON; a folder without the sweep is refused with what to run."""

from __future__ import annotations

import json

import pytest

from harness.cost_model.build import profile_from_frames
from harness.cost_model.fit import fit_collective, fit_linear, fit_message
from harness.cost_model.profile import Profile, ProfileError
from harness.cost_model.sweep import OPS

from .synthetic import SIZES, alpha_beta, calibration_rows

EXACT = 1e-9  # the synthetic times follow the model exactly: only float rounding of a 2x2 solve remains


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("g", [2, 3, 4, 8])
def test_fit_recovers_alpha_beta(op, g):
    from harness.cost_model.fit import collective_terms

    a, b = alpha_beta(op, g)
    times = [collective_terms(op, g, s)[0] * a + collective_terms(op, g, s)[1] * b for s in SIZES]
    fit = fit_collective(op, g, SIZES, times)
    assert fit.alpha == pytest.approx(a, rel=EXACT) and fit.beta == pytest.approx(b, rel=EXACT)
    assert fit.max_rel_error < EXACT and fit.points == len(SIZES)


def test_fit_is_non_negative_and_reports_its_error():
    # times falling with size: the unconstrained β is negative; the constrained fit puts it at 0 and the
    # error it reports is the real one, not hidden
    fit = fit_message([1e3, 1e6, 1e7], [3e-3, 2e-3, 1e-3])
    assert fit.beta == 0.0 and fit.alpha > 0
    assert fit.max_rel_error == pytest.approx(max(abs(fit.alpha - t) / t for t in (3e-3, 2e-3, 1e-3)))
    with pytest.raises(ValueError, match="at least two points"):
        fit_linear([1.0], [1.0], [1.0])
    with pytest.raises(ValueError, match="positive and finite"):
        fit_linear([1.0, 1.0], [1.0, 2.0], [1.0, 0.0])


def test_profile_from_synthetic_gpu_rows_round_trips(tmp_path):
    rows = calibration_rows(8, backend="nccl", rate=2e12, overhead=1e-4)
    host = {"cpu": "x", "cores": 64, "device": "NVIDIA H100 80GB HBM3", "torch": "2.13.0", "hostname": "node1"}
    prof = profile_from_frames(rows, None, "nccl", host, "synthetic")
    assert prof.backend == "nccl" and prof.world_sizes == [8]
    assert {(e["op"], e["group_size"]) for e in prof.collectives} == {(op, g) for op in OPS for g in (2, 4, 8)}
    for e in prof.collectives:
        a, b = alpha_beta(e["op"], e["group_size"])
        assert e["alpha_s"] == pytest.approx(a, rel=EXACT) and e["beta_s_per_byte"] == pytest.approx(b, rel=EXACT)
    assert prof.message_time("send", 1e6, 8) == pytest.approx(5e-6 + 1e6 / 20e9, rel=EXACT)
    assert prof.message_time("one_way", 0, 8) == pytest.approx(8e-6, rel=EXACT)
    assert prof.flops_per_s("bfloat16", 8) == pytest.approx(2e12, rel=EXACT)
    assert prof.layer_overhead("gpt_block", "bfloat16", 8) == pytest.approx(1e-4, rel=1e-6)
    loaded = Profile.load(prof.save(tmp_path / "p.json"))
    assert loaded.to_json() == prof.to_json()
    assert loaded.collective_time("all_reduce", 4, 1 << 20, 8) == prof.collective_time("all_reduce", 4, 1 << 20, 8)
    assert loaded.collective_time("all_reduce", 1, 1 << 20, 8) == 0.0  # one rank: nothing to reduce


def test_missing_measurements_name_what_to_run():
    rows = calibration_rows(2)
    with pytest.raises(ProfileError, match=r"point-to-point.*paritybench calibrate"):
        profile_from_frames(rows[rows["kind"] != "p2p"], None, "gloo", {}, "somewhere")


@pytest.mark.parametrize("text, needle", [
    ("{not json", "not valid JSON"),
    (json.dumps({"profile_version": 99}), "not a profile of version 1"),
    (json.dumps([1, 2]), "not a profile of version 1"),
    (json.dumps({"profile_version": 1, "backend": "gloo", "host": {}, "collectives": [{"op": "x"}], "p2p": [],
                 "compute": []}), "not a valid profile"),
])
def test_bad_profile_files(tmp_path, text, needle):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(ProfileError, match=needle):
        Profile.load(path)
    with pytest.raises(ProfileError, match="cannot read"):
        Profile.load(tmp_path / "absent.json")
