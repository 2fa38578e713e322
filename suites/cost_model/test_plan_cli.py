"""``paritybench plan``: the seed's 70B question answered in a table and in JSON; bad input exits 2."""

from __future__ import annotations

import json

import pytest

from harness.cli.main import main
from harness.cost_model.plan import parse_count, parse_memory

SEED = ["plan", "--params", "70B", "--zero", "1", "--dp", "64", "--tp", "8", "--pp", "4", "--seq", "4096",
        "--batch", "1", "--hidden", "8192", "--heads", "64", "--layers", "80"]


def test_seed_layout_as_json(capsys):
    assert main([*SEED, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    mem = out["memory_bytes"]
    psi = 70e9 / 32
    assert mem["weights"] == pytest.approx(2 * psi) and mem["optimizer"] == pytest.approx(12 * psi / 64)
    # 1 microbatch in flight x 20 layers x sbh(10 + 24/8 + 5*64*4096/(8192*8))
    assert mem["activations"] == pytest.approx(20 * 4096 * 8192 * (10 + 3 + 20))
    assert mem["total"] == pytest.approx(sum(v for k, v in mem.items() if k != "total"))
    assert out["comm_bytes_per_step"]["dp"] == pytest.approx(2 * 63 / 64 * psi * 2)


def test_float8_weights_take_one_byte_in_memory_and_in_the_gathers(capsys):
    """The seed's 70B at ZeRO-3 over dp 64 with --fp8-weights: the weight shard 1 byte per parameter (half of bf16's),
    gradients and Adam state unchanged; ZeRO-3's two parameter all-gathers 1 byte each, the gradients' reduce-scatter
    2 — 4 of 6 bytes' passes. Table and JSON say it."""
    argv = [*SEED, "--json"]
    argv[argv.index("--zero") + 1] = "3"
    plans = {}
    for fp8 in (False, True):
        assert main(argv + (["--fp8-weights"] if fp8 else [])) == 0
        plans[fp8] = json.loads(capsys.readouterr().out)
    psi = 70e9 / 32
    bf16, fp8 = plans[False]["memory_bytes"], plans[True]["memory_bytes"]
    assert fp8["weights"] == pytest.approx(psi / 64) and bf16["weights"] == pytest.approx(2 * psi / 64)
    assert (fp8["gradients"], fp8["optimizer"], fp8["activations"]) == \
        (bf16["gradients"], bf16["optimizer"], bf16["activations"])
    assert plans[True]["comm_bytes_per_step"]["dp"] == pytest.approx(63 / 64 * psi * (2 + 1 + 1))
    assert plans[False]["comm_bytes_per_step"]["dp"] == pytest.approx(63 / 64 * psi * (2 + 2 + 2))
    assert plans[True]["model"]["fp8_weights"] is True
    assert main([*SEED, "--fp8-weights"]) == 0
    assert "float8 weights" in capsys.readouterr().out


def test_offload_plans_the_device_and_the_host_apart(capsys):
    """The seed's 70B at ZeRO-2 with --offload optimizer: the device keeps the bf16 weights (2 Psi) and its
    activations, the host this rank's gradient and Adam shards ((2 + 12) Psi / 64); the fit is the device's, and
    every layout listed offloads at a stage that can (ZeRO 1-3; --offload parameters: ZeRO 3 alone)."""
    argv = [*SEED, "--json", "--device-memory", "80GB"]
    argv[argv.index("--zero") + 1] = "2"
    assert main([*argv, "--offload", "optimizer"]) == 0
    out = json.loads(capsys.readouterr().out)
    psi, mem, host = 70e9 / 32, out["memory_bytes"], out["host_bytes"]
    assert (mem["weights"], mem["gradients"], mem["optimizer"]) == pytest.approx((2 * psi, 0, 0))
    assert mem["total"] == pytest.approx(2 * psi + mem["activations"]) and out["fits"] is True
    assert (host["weights"], host["gradients"], host["optimizer"]) == pytest.approx((0, 2 * psi / 64, 12 * psi / 64))
    assert out["model"]["offload"] == "optimizer" and {e["layout"]["zero"] for e in out["fitting_layouts"]} == {1, 2, 3}
    assert main([*SEED, "--zero", "3", "--offload", "parameters", "--device-memory", "80GB"]) == 0
    table = capsys.readouterr().out
    assert "host memory (parameters offloaded), per rank" in table
    assert {int(line.split("│")[5]) for line in table.splitlines() if line.count("│") == 9} == {3}  # ZeRO column
    assert main([*SEED, "--json"]) == 0 and "host_bytes" not in json.loads(capsys.readouterr().out)


def test_one_device_does_not_fit_and_the_answer_says_how_to_split(capsys):
    argv = ["plan", "--params", "70B", "--hidden", "8192", "--heads", "64", "--layers", "80", "--seq", "4096",
            "--microbatches", "8", "--sequence-parallel", "--recompute", "selective", "--device-memory", "80GB",
            "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert not out["fits"] and out["memory_bytes"]["total"] > 1.12e12
    assert out["fitting_layouts"] == []  # one GPU: no other layout either


def test_device_memory_ranks_fitting_layouts(capsys):
    argv = [*SEED, "--microbatches", "16", "--sequence-parallel", "--recompute", "selective",
            "--device-memory", "80GB", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"]
    ranked = out["fitting_layouts"]
    assert ranked and all(e["memory_bytes"]["total"] <= 80e9 for e in ranked)
    assert all(lay["layout"]["dp"] * lay["layout"]["tp"] * lay["layout"]["pp"] == 2048 for lay in ranked)
    keys = [(e["bubble_fraction_1f1b"], e["comm_bytes_per_step"]["total"]) for e in ranked]
    assert keys == sorted(keys)


def test_table_output(capsys):
    assert main([*SEED, "--device-memory", "80GB"]) == 0
    out = capsys.readouterr().out
    for needle in ("weights", "optimizer", "activations", "communication per step", "it fits in 80.0 GB"):
        assert needle in out


@pytest.mark.parametrize("text, value", [("70B", 70e9), ("7.5e9", 7.5e9), ("350M", 350e6), ("1T", 1e12)])
def test_parse_count(text, value):
    assert parse_count(text) == value


@pytest.mark.parametrize("text, value", [("80GB", 80e9), ("1TB", 1e12), ("80GiB", 80 * 2**30), ("8e10", 8e10)])
def test_parse_memory(text, value):
    assert parse_memory(text) == value


@pytest.mark.parametrize("extra, needle", [
    (["--params", "lots"], "--params 'lots' is not a parameter count"),
    (["--params", "70B", "--device-memory", "huge"], "--device-memory 'huge' is not a memory size"),
    (["--params", "70B", "--pp", "3"], "--pp (3) must divide --layers (80)"),
    (["--params", "70B", "--tp", "3"], "tp (3) must divide the number of heads (64)"),
    (["--params", "70B", "--dp", "0"], "0 must be at least 1"),
    (["--params", "70B", "--zero", "5"], "invalid choice: 5"),
    (["--params", "70B", "--offload", "optimizer"], "offloading the optimizer needs ZeRO 1, 2 or 3"),
    (["--params", "70B", "--zero", "2", "--offload", "parameters"], "offloading the parameters needs ZeRO 3"),
    (["--params", "70B", "--offload", "activations"], "invalid choice: 'activations'"),
])
def test_bad_input_exit_2(capsys, extra, needle):
    base = ["plan", "--hidden", "8192", "--heads", "64", "--layers", "80"]
    assert main([*base, *extra]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err
