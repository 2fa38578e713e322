"""Context parallelism's cost model (``reference.cost_model.context``) and ``plan --cp``: the bytes by hand,
the activation memory against the accounting it divides, the 128k-context question, bad input."""

from __future__ import annotations

import json
import re

import pytest

from harness.cli.main import main
from reference.cost_model import activation_memory, cp_activation_memory, cp_layer_comm_bytes, training_memory


def test_ring_and_ulysses_bytes_by_hand():
    # b 1, s 8192 over cp 4 (2048 each), 32 heads over 8 KV heads of 128, 2 bytes
    block = 2 * 1 * 8 * 2048 * 128 * 2  # k and v of one rank
    ring = cp_layer_comm_bytes("ring", 1, 8192, 32, 8, 128, 4)
    assert ring == {"forward": 3 * block, "backward": 7 * block, "total": 10 * block}
    uly = cp_layer_comm_bytes("ulysses", 1, 8192, 32, 8, 128, 4)
    assert uly["forward"] == uly["backward"] == 3 / 4 * 2048 * 128 * 2 * (2 * 32 + 2 * 8)
    mqa = cp_layer_comm_bytes("ulysses", 1, 8192, 32, 1, 128, 4)  # one KV head replicated to 4
    assert mqa["forward"] == 3 / 4 * 2048 * 128 * 2 * (2 * 32 + 2 * 4)
    assert cp_layer_comm_bytes("ring", 1, 8192, 32, 8, 128, 1)["total"] == 0


def test_activation_memory_divides_as_each_algorithm_keeps_it():
    args = (131072, 1, 4096, 32)
    assert cp_activation_memory("ulysses", *args, 4, cp=8) == pytest.approx(activation_memory(*args, 4) / 8)
    assert cp_activation_memory("ring", *args, 4, cp=8) == pytest.approx(
        activation_memory(131072 // 8, 1, 4096, 32, 4, recompute="selective"))  # no s x s scores kept
    assert cp_activation_memory("ring", *args, 4, cp=8) < cp_activation_memory("ulysses", *args, 4, cp=8)


@pytest.mark.parametrize("bad, needle", [
    (lambda: cp_layer_comm_bytes("ring", 1, 10, 4, 4, 8, 4), "cp (4) must divide the sequence (10 tokens)."),
    (lambda: cp_layer_comm_bytes("tree", 1, 8, 4, 4, 8, 4), "algorithm"),
    (lambda: cp_activation_memory("ring", 10, 1, 8, 4, cp=3), "cp (3) must divide the sequence (10 tokens).")])
def test_bad_arguments_are_one_sentence(bad, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        bad()


LONG = ["plan", "--params", "8B", "--zero", "1", "--seq", "131072", "--batch", "1", "--hidden", "4096", "--heads",
        "32", "--kv-heads", "8", "--layers", "32", "--recompute", "selective", "--device-memory", "80GB", "--json"]


def test_a_128k_context_fits_80_gb_with_cp_and_not_without(capsys):
    assert main([*LONG, "--dp", "8", "--tp", "8", "--cp", "8"]) == 0
    with_cp = json.loads(capsys.readouterr().out)
    assert with_cp["fits"] and with_cp["layout"]["cp"] == 8
    assert with_cp["memory_bytes"]["weights"] == pytest.approx(training_memory(8e9, zero_stage=1, dp=64, tp=8).weights)
    per_layer = cp_layer_comm_bytes("ring", 1, 131072, 32 // 8, 1, 128, 8)["total"]
    assert with_cp["comm_bytes_per_step"]["cp"] == pytest.approx(32 * per_layer)
    assert all(e["layout"]["cp"] == 8 for e in with_cp["fitting_layouts"])
    assert main([*LONG, "--dp", "64", "--tp", "8"]) == 0
    without = json.loads(capsys.readouterr().out)
    assert not without["fits"] and "cp" not in without["comm_bytes_per_step"]


@pytest.mark.parametrize("extra, needle", [
    (["--cp", "3"], "--cp (3) must divide --seq (131072)")])
def test_plan_cp_bad_input_is_one_sentence(capsys, extra, needle):
    argv = [a for a in LONG if a != "--json"]
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err


def test_expert_parallel_bytes_by_hand():
    from reference.cost_model import balanced_ep_bytes, ep_layer_comm_bytes

    # EP rank 1 of 2 sends 5 rows to rank 0 and keeps 7; receives 3 from rank 0; hidden 16, 2 bytes
    got = ep_layer_comm_bytes([5, 7], [3, 7], 1, 16)
    assert got["forward"] == 8 + 8 * 5 + (5 + 3) * 16 * 2 and got["backward"] == (5 + 3) * 16 * 2
    assert balanced_ep_bytes(1024, 2, 4096, 8)["total"] == 4 * 1024 * 2 * 4096 * 2 * 7 / 8
    with pytest.raises(ValueError, match="one count per EP rank"):
        ep_layer_comm_bytes([1, 2], [1], 0, 16)


MIXTRAL = ["plan", "--params", "47B", "--experts", "8", "--top-k", "2", "--hidden", "4096", "--heads", "32",
           "--layers", "32", "--ffn", "14336", "--seq", "4096", "--batch", "1", "--zero", "1", "--json"]


def test_plan_experts_by_hand(capsys):
    """A Mixtral-like 47B (8 SwiGLU experts of 14336 per layer, 45.1B of the 47B) at dp 8 x ep 8, ZeRO 1: the
    dense 1.9B sharded over the 8 replicas, each rank's one expert per layer over its expert-data-parallel group
    of 1; the dispatch and combine bytes of balanced routing."""
    from reference.cost_model import balanced_ep_bytes, expert_params

    assert main([*MIXTRAL, "--dp", "8", "--ep", "8"]) == 0
    out = json.loads(capsys.readouterr().out)
    experts = expert_params(32, 8, 4096, 14336)
    assert experts == 32 * 8 * 3 * 4096 * 14336
    dense, routed = training_memory(47e9 - experts, zero_stage=1, dp=8), training_memory(experts / 8, zero_stage=1)
    for kind in ("weights", "gradients", "optimizer"):
        assert out["memory_bytes"][kind] == pytest.approx(getattr(dense, kind) + getattr(routed, kind), rel=1e-12)
    assert out["comm_bytes_per_step"]["ep"] == pytest.approx(32 * balanced_ep_bytes(4096, 2, 4096, 8)["total"])
    assert out["layout"]["ep"] == 8


@pytest.mark.parametrize("extra, needle", [
    (["--dp", "8", "--ep", "3"], "--ep (3) must divide dp x cp (8)"),
    (["--dp", "6", "--ep", "3"], "--ep (3) must divide --experts (8)"),
    (["--dp", "2", "--ep", "2", "--params", "1B"], "--params counts every parameter, experts included"),
], ids=["ep-not-dividing-dp", "ep-not-dividing-experts", "params-below-experts"])
def test_plan_experts_bad_input_is_one_sentence(capsys, extra, needle):
    argv = [a for a in MIXTRAL if a != "--json"]
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err


def test_plan_ep_without_experts_is_one_sentence(capsys):
    assert main([*[a for a in LONG if a != "--json"], "--dp", "8", "--tp", "8", "--ep", "2"]) == 2
    err = capsys.readouterr().err
    assert "give --experts" in err and err.count("\n") == 1, err
