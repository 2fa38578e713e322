"""Memory formulas: the seed's 70B table exactly, ZeRO's ordering and limits, activations per table 2."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference.cost_model import activation_memory, offloaded_memory, training_memory

PARAMS = st.floats(1e6, 1e13, allow_nan=False)
DP = st.integers(1, 4096)


def test_seed_70b_on_one_device():
    m = training_memory(70e9)
    assert (m.weights, m.gradients, m.optimizer) == (140e9, 140e9, 840e9)
    assert m.total == 1.12e12 > 1e12


@pytest.mark.parametrize("stage, expected", [
    (0, (140e9, 140e9, 840e9)),
    (1, (140e9, 140e9, 840e9 / 64)),       # 4 Psi + K Psi / N_d
    (2, (140e9, 140e9 / 64, 840e9 / 64)),  # 2 Psi + (2 + K) Psi / N_d
    (3, (140e9 / 64, 140e9 / 64, 840e9 / 64)),
])
def test_zero_stages_70b_dp64(stage, expected):
    m = training_memory(70e9, zero_stage=stage, dp=64)
    assert (m.weights, m.gradients, m.optimizer) == pytest.approx(expected, rel=1e-15)


def test_tp_and_pp_divide_the_parameters_held():
    assert training_memory(70e9, tp=8, pp=4).total == pytest.approx(1.12e12 / 32, rel=1e-15)


@pytest.mark.parametrize("stage, offload, device, host", [
    # ZeRO-Offload (Ren et al. 2021): the bf16 weights stay, the gradient and Adam shards (2 + 12) Psi / N_d go
    (1, "optimizer", (140e9, 0, 0), (0, 140e9 / 64, 840e9 / 64)),
    (2, "optimizer", (140e9, 0, 0), (0, 140e9 / 64, 840e9 / 64)),
    (3, "optimizer", (140e9 / 64, 0, 0), (0, 140e9 / 64, 840e9 / 64)),
    (3, "parameters", (0, 0, 0), (140e9 / 64, 140e9 / 64, 840e9 / 64)),  # FSDP2's CPUOffloadPolicy, offload_param
])
def test_offload_moves_the_shards_to_the_host_70b_dp64(stage, offload, device, host):
    on_device, on_host = offloaded_memory(70e9, zero_stage=stage, dp=64, offload=offload)
    assert (on_device.weights, on_device.gradients, on_device.optimizer) == pytest.approx(device, rel=1e-15)
    assert (on_host.weights, on_host.gradients, on_host.optimizer) == pytest.approx(host, rel=1e-15)


@given(PARAMS, DP, st.sampled_from([(1, "optimizer"), (2, "optimizer"), (3, "optimizer"), (3, "parameters")]))
def test_offload_keeps_every_byte_of_the_sharded_state(n, dp, where):
    """Device + host = what the stage holds with no offload, less the gradients the device no longer keeps whole
    (the host keeps their shard): nothing counted twice, nothing lost from the optimizer's and weights' shards."""
    stage, offload = where
    states = training_memory(n, zero_stage=stage, dp=dp)
    on_device, on_host = offloaded_memory(n, zero_stage=stage, dp=dp, offload=offload)
    assert on_device.weights + on_host.weights == pytest.approx(states.weights, rel=1e-12)
    assert on_device.optimizer + on_host.optimizer == pytest.approx(states.optimizer, rel=1e-12)
    assert on_device.gradients == 0 and on_host.gradients == pytest.approx(2 * n / dp, rel=1e-12)
    none_device, none_host = offloaded_memory(n, zero_stage=stage, dp=dp, offload="none")
    assert none_device == states and none_host.total == 0


@given(PARAMS, DP, DP)
def test_more_dp_never_needs_more_memory(n, dp_a, dp_b):
    lo, hi = sorted((dp_a, dp_b))
    for stage in range(4):
        assert training_memory(n, zero_stage=stage, dp=hi).total <= training_memory(n, zero_stage=stage, dp=lo).total


@given(PARAMS, DP)
def test_stages_are_ordered(n, dp):
    totals = [training_memory(n, zero_stage=s, dp=dp).total for s in range(4)]
    assert totals[0] >= totals[1] >= totals[2] >= totals[3]


@given(PARAMS)
def test_zero_savings_limits_as_dp_grows(n):
    """ZeRO paper, figure 1: ~4x for stage 1, ~8x for stage 2, N_d x for stage 3 (K = 12)."""
    dp = 10**9
    base = training_memory(n).total
    assert base / training_memory(n, zero_stage=1, dp=dp).total == pytest.approx(4.0, rel=1e-6)
    assert base / training_memory(n, zero_stage=2, dp=dp).total == pytest.approx(8.0, rel=1e-6)
    assert base / training_memory(n, zero_stage=3, dp=64).total == pytest.approx(64.0, rel=1e-12)


def test_activations_table_2_by_hand():
    s, b, h, a, t = 2048, 4, 1024, 16, 4
    sbh = s * b * h
    assert activation_memory(s, b, h, a) == sbh * (34 + 5 * a * s / h)
    assert activation_memory(s, b, h, a, tp=t) == sbh * (10 + 24 / t + 5 * a * s / (h * t))
    assert activation_memory(s, b, h, a, tp=t, sequence_parallel=True) == sbh * (34 / t + 5 * a * s / (h * t))
    assert activation_memory(s, b, h, a, tp=t, recompute="selective") == sbh * (10 + 24 / t)
    assert activation_memory(s, b, h, a, tp=t, sequence_parallel=True, recompute="selective") == sbh * 34 / t
    assert activation_memory(s, b, h, a, layers=3, recompute="full") == 3 * 2 * sbh


@given(st.sampled_from([1, 2, 4, 8]), st.integers(1, 8), st.sampled_from([512, 2048]))
def test_activation_savings_are_ordered(tp, layers, seq):
    def mem(**kw):
        return activation_memory(seq, 2, 1024, 16, layers, tp=tp, **kw)

    assert mem() >= mem(sequence_parallel=True) >= mem(sequence_parallel=True, recompute="selective")
    assert mem() >= mem(recompute="selective") >= mem(recompute="full")
    if tp == 1:  # the tensor-parallel forms reduce to the unparallelised one
        assert mem() == mem(sequence_parallel=True)


@pytest.mark.parametrize("call, message", [
    (lambda: training_memory(-1), "n_params must be a number > 0; got -1"),
    (lambda: training_memory(1e9, zero_stage=4), "zero_stage must be one of 0, 1, 2, 3; got 4"),
    (lambda: training_memory(1e9, dp=0), "dp must be a whole number >= 1; got 0"),
    (lambda: training_memory("70B"), "n_params must be a number > 0; got '70B'"),  # before: TypeError comparing a str
    (lambda: activation_memory(2048, 1, 1024, 12, tp=8), r"tp \(8\) must divide the number of heads \(12\)"),
    (lambda: activation_memory(2048, 1, 1024, 16, recompute="some"), "recompute must be one of none"),
    (lambda: offloaded_memory(1e9, zero_stage=0, offload="optimizer"),
     r"offloading the optimizer needs ZeRO 1, 2 or 3 \(the host holds this rank's shard\); got ZeRO 0"),
    (lambda: offloaded_memory(1e9, zero_stage=2, offload="parameters"), "offloading the parameters needs ZeRO 3"),
    (lambda: offloaded_memory(1e9, zero_stage=3, offload="activations"), "offload must be one of none, optimizer"),
])
def test_bad_arguments_name_the_value_and_range(call, message):
    with pytest.raises(ValueError, match=message):
        call()
