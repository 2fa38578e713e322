"""Communication formulas: closed forms, limits, and agreement with what the reference algorithms send."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference.cost_model import (
    alpha_beta_time,
    bubble_fraction,
    busbw_factor,
    checkpoint_segments,
    collective_bytes,
    dp_step_comm_bytes,
    hsdp_step_comm_bytes,
    recompute_overhead,
    sqrt_checkpoint_memory,
    tp_layer_comm_bytes,
)
from suites.collectives.ranks import bytes_sent


@given(st.integers(2, 10**6))
def test_ring_all_reduce_tends_to_2s(n):
    s = 1e9
    sent = collective_bytes("all_reduce", n, s)
    assert sent == 2 * (n - 1) / n * s and sent < 2 * s
    assert busbw_factor("all_reduce", n) * s == sent  # busbw's factor is the ring's volume per byte


def test_ring_all_reduce_limit():
    assert collective_bytes("all_reduce", 10**9, 1.0) == pytest.approx(2.0, rel=1e-8)


@pytest.mark.parametrize("algorithm, ops", [
    ("ring", ["all_reduce", "reduce_scatter", "all_gather", "all_to_all"]),
    ("rhd", ["all_reduce"]), ("tree", ["all_reduce", "broadcast", "reduce"]), ("naive", ["all_reduce"]),
])
def test_model_matches_the_reference_byte_counts(world_cache, world_sizes, algorithm, ops):
    """The busiest rank of each reference algorithm sends exactly what the model says (S divisible by n)."""
    names = {("ring", "all_reduce"): "ring_all_reduce", ("ring", "reduce_scatter"): "ring_reduce_scatter",
             ("ring", "all_gather"): "ring_all_gather", ("ring", "all_to_all"): "pairwise_all_to_all",
             ("rhd", "all_reduce"): "rhd_all_reduce", ("tree", "all_reduce"): "tree_all_reduce",
             ("tree", "broadcast"): "tree_broadcast", ("tree", "reduce"): "tree_reduce",
             ("naive", "all_reduce"): "naive_all_reduce"}
    for n in world_sizes:
        for op in ops:
            block = 12  # per-rank numel for RS/AG/a2a, so S = n * 12 elements; 12 * n for the others
            numel = block if op in ("reduce_scatter", "all_gather", "all_to_all") else 12 * n
            sent = world_cache.get(n).run(bytes_sent, names[algorithm, op], numel, "float32", 0, None)
            s = 4 * 12 * n
            assert max(sent) == collective_bytes(op, n, s, algorithm), (algorithm, op, n, sent)


def test_alpha_beta_forms():
    assert alpha_beta_time("all_reduce", 4, 8e6, 1e-5, 1e-9) == pytest.approx(6e-5 + 1.2e-2)
    assert alpha_beta_time("all_reduce", 8, 8e6, 1e-5, 1e-9, "rhd") == pytest.approx(6e-5 + 2 * 7 / 8 * 8e-3)
    assert alpha_beta_time("broadcast", 5, 1e6, 1e-5, 1e-9, "tree") == pytest.approx(3 * (1e-5 + 1e-3))
    assert alpha_beta_time("all_reduce", 1, 1e6, 1.0, 1.0) == 0.0


@given(st.floats(1e6, 1e12), st.integers(1, 4096))
def test_dp_volume_2psi_and_3psi(n, dp):
    for stage in (0, 1, 2):
        assert dp_step_comm_bytes(n, stage, dp) == 2 * (dp - 1) / dp * n * 2
    assert dp_step_comm_bytes(n, 3, dp) == pytest.approx(1.5 * dp_step_comm_bytes(n, 0, dp), rel=1e-15)


@given(st.floats(1e6, 1e12), st.integers(1, 64), st.integers(1, 64))
def test_hsdp_bytes_apart_and_at_its_corners(n, replicate, shard):
    """HSDP's two reductions: ZeRO-1/2 over R x S moves what ZeRO over R S ranks moves, 2 (RS - 1) / RS Psi, the
    replicas' share 2 (R - 1) / (R S) Psi; ZeRO-3 gathers within the shard group only — less than flat ZeRO-3 for R > 1.
    (n, 1): the replicas all-reduce whole gradients (DP's bytes); (1, n): ZeRO's."""
    world = replicate * shard
    for stage in (1, 2, 3):
        b = hsdp_step_comm_bytes(n, stage, replicate, shard)
        assert b["total"] == b["shard"] + b["replicate"]
        assert b["replicate"] == pytest.approx(2 * (replicate - 1) / replicate * n / shard * 2, rel=1e-12)
        if stage < 3:
            assert b["total"] == pytest.approx(dp_step_comm_bytes(n, stage, world), rel=1e-12)
        else:
            assert b["total"] <= dp_step_comm_bytes(n, 3, world) * (1 + 1e-12)
    assert hsdp_step_comm_bytes(n, 2, world, 1)["shard"] == 0
    assert hsdp_step_comm_bytes(n, 2, world, 1)["total"] == pytest.approx(dp_step_comm_bytes(n, 0, world), rel=1e-12)
    assert hsdp_step_comm_bytes(n, 3, 1, world)["total"] == dp_step_comm_bytes(n, 3, world)


@given(st.floats(1e6, 1e12), st.integers(2, 4096))
def test_float8_weights_halve_only_the_parameter_gathers(n, dp):
    """Gradients move in bf16 (2 bytes), parameters in float8 (1): ZeRO-0's all-reduce is all gradients (unchanged),
    ZeRO-1/2 gather the parameters once (3 of 4 bytes' passes), ZeRO-3 twice (2 + 1 + 1 of 6)."""
    bf16 = {z: dp_step_comm_bytes(n, z, dp) for z in range(4)}
    fp8 = {z: dp_step_comm_bytes(n, z, dp, weight_bytes=1) for z in range(4)}
    assert fp8[0] == bf16[0]
    for z, ratio in ((1, 3 / 4), (2, 3 / 4), (3, 4 / 6)):
        assert fp8[z] == pytest.approx(ratio * bf16[z], rel=1e-15), z
    assert bf16[3] - fp8[3] == pytest.approx(2 * (dp - 1) / dp * n, rel=1e-12)  # two gathers, one byte less each


def test_dp_volume_limit_is_2psi_bytes():
    assert dp_step_comm_bytes(1e9, 0, 10**9) == pytest.approx(2 * 1e9 * 2, rel=1e-8)


def test_tp_four_all_reduces_per_layer():
    b, s, h = 1, 4096, 8192
    assert tp_layer_comm_bytes(b, s, h, 8) == 4 * 2 * 7 / 8 * b * s * h * 2
    assert tp_layer_comm_bytes(b, s, h, 1) == 0


@pytest.mark.parametrize("schedule, p, m, v, expected", [
    ("gpipe", 4, 8, 1, 3 / 11), ("1f1b", 4, 8, 1, 3 / 11), ("1f1b", 1, 5, 1, 0.0),
    ("interleaved", 4, 8, 2, 3 / 19), ("zb-h1", 4, 8, 1, 3 / 27),
])
def test_bubble_fractions(schedule, p, m, v, expected):
    assert bubble_fraction(schedule, p, m, v) == pytest.approx(expected, rel=1e-15)


@given(st.integers(1, 64), st.integers(1, 256))
def test_bubble_ordering(p, m):
    one = bubble_fraction("1f1b", p, m)
    assert bubble_fraction("zb-h1", p, m) <= one
    if m % p == 0:
        assert bubble_fraction("interleaved", p, m, 2) <= one


def test_recompute_and_sqrt_checkpointing():
    assert recompute_overhead() == pytest.approx(1 / 3)  # the seed's "+~30% compute"
    assert recompute_overhead(recomputed_fraction=0.0) == 0.0
    assert checkpoint_segments(16) == 4 and sqrt_checkpoint_memory(16) == 8.0
    assert checkpoint_segments(100) == 10 and sqrt_checkpoint_memory(100, 2.0) == 40.0


@given(st.integers(4, 10**4))
def test_sqrt_checkpoint_memory_is_about_2_sqrt_l(layers):
    mem = sqrt_checkpoint_memory(layers)
    assert 2 * layers**0.5 <= mem <= 2 * layers**0.5 + 2 and mem <= layers


@pytest.mark.parametrize("call, message", [
    (lambda: collective_bytes("all_reduce", 0, 1.0), "n must be a whole number >= 1; got 0"),
    (lambda: collective_bytes("gossip", 2, 1.0), "op must be one of all_reduce"),
    (lambda: collective_bytes("all_gather", 4, 1.0, "tree"), "algorithm 'tree' is not modelled for all_gather"),
    (lambda: collective_bytes("all_reduce", 2, -5.0), "size must be a number >= 0; got -5.0"),
    (lambda: bubble_fraction("interleaved", 4, 6, 2), "m to be a multiple of p"),
    (lambda: bubble_fraction("1f1b", 4, 8, 2), "applies to the interleaved schedules only"),
    (lambda: bubble_fraction("1f1b", 4, 0), "m must be a whole number >= 1; got 0"),
    (lambda: recompute_overhead(recomputed_fraction=1.5), "between 0 and 1"),
])
def test_bad_arguments_name_the_value_and_range(call, message):
    with pytest.raises(ValueError, match=message):
        call()
