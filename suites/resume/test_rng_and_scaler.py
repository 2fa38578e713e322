"""The rest of the training state a resume needs: keyed dropout (the RNG policy: masks from (seed, step,
layer, site, global sample), so a layout change draws the same masks), the dynamic loss scaler's rule and
state, a step skipped on every rank when one rank's gradient overflows, and a trainer with a scaler
refusing a checkpoint without scaler state."""

from __future__ import annotations

import pytest
import torch

from harness.resume import case
from harness.resume.case import Recipe
from reference.dropout import DropoutKey, KeyedDropout
from reference.mixed_precision import DynamicLossScaler


def _drop(p=0.25, seed=3, step=0, samples=None, layer=1, site="mlp"):
    key = DropoutKey(seed)
    key.step, key.samples = step, samples
    return KeyedDropout(p, key, layer, site)


def test_a_row_s_mask_depends_on_its_global_sample_not_its_position():
    whole = _drop().mask(torch.Size([6, 4, 16]))
    part = _drop(samples=torch.tensor([4, 5])).mask(torch.Size([2, 4, 16]))
    assert torch.equal(part, whole[4:6])  # a replica holding samples 4, 5 draws one device's rows 4, 5
    assert not torch.equal(whole[0], whole[1])


@pytest.mark.parametrize("change", [{"step": 1}, {"seed": 4}, {"layer": 2}, {"site": "attn"}])
def test_every_part_of_the_key_changes_the_mask(change):
    shape = torch.Size([2, 4, 16])
    assert not torch.equal(_drop().mask(shape), _drop(**change).mask(shape))


def test_dropout_keeps_one_minus_p_and_rescales():
    x = torch.ones(64, 8, 32, dtype=torch.float64)
    y = _drop(p=0.25)(x)
    kept = float((y != 0).double().mean())
    # 16,384 Bernoulli(0.75) draws: standard deviation sqrt(0.75 * 0.25 / 16384) = 0.0034; 5 of them
    assert abs(kept - 0.75) < 5 * 0.0034
    assert set(torch.unique(y).tolist()) == {0.0, 1 / 0.75}
    drop = _drop(p=0.25)
    drop.eval()
    assert drop(x) is x and _drop(p=0.0)(x) is x


def test_bad_dropout_arguments_are_one_sentence():
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\); got 1"):
        _drop(p=1)
    with pytest.raises(ValueError, match="dropout site must be one of embed, attn, mlp; got 'ffn'"):
        _drop(site="ffn")
    with pytest.raises(ValueError, match="names 3 samples but the activation has 2 rows"):
        _drop(samples=torch.tensor([0, 1, 2]))(torch.ones(2, 3, dtype=torch.float64))


def test_the_loss_scaler_backs_off_on_overflow_and_grows_after_an_interval():
    s = DynamicLossScaler(8.0, growth_interval=2)
    trail = [(s.update(found), s.scale, s.growth_tracker) for found in (False, False, True, False, True, True)]
    assert trail == [(True, 8.0, 1), (True, 16.0, 0), (False, 8.0, 0), (True, 8.0, 1), (False, 4.0, 0),
                     (False, 2.0, 0)]
    again = DynamicLossScaler()
    again.load_state_dict(s.state_dict())
    assert again.state_dict() == {"scale": 2.0, "growth_tracker": 0, "skipped": 3}


@pytest.mark.parametrize("kwargs, message", [
    ({"init_scale": 3.0}, "init_scale must be a positive power of two"),
    ({"backoff_factor": 2.0}, "backoff_factor < 1"),
    ({"growth_interval": 0}, "growth_interval must be at least 1"),
])
def test_bad_scaler_arguments_are_one_sentence(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DynamicLossScaler(**kwargs)


def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(world_cache):
    # rank 5 of 2x2x2 (dp 1, pp 0, tp 1) under ZeRO 2: its inf lands in one DP rank's shard only
    per_rank = world_cache.get(8).run(case.overflow_skipped_everywhere, (2, 2, 2), "1f1b", 2, 5, 1, timeout=300)
    assert all(r["scaler"] == {"scale": 512.0, "growth_tracker": 1, "skipped": 1} for r in per_rank), per_rank[0]
    assert not [p for r in per_rank for p in r["problems"]], per_rank[0]["problems"]


def test_a_scaled_trainer_refuses_a_checkpoint_without_scaler_state(world_cache, tmp_path):
    world_cache.get(1).run(case.train_and_save, str(tmp_path), (1, 1, 1), "1f1b", 0, 1, timeout=300)
    got = world_cache.get(1).run(case.resume_and_compare, str(tmp_path), (1, 1, 1), "1f1b", 0, 1, 0,
                                 Recipe(growth_interval=3), timeout=300)[0]
    assert got["refused"] == (f"{tmp_path}/step-1/metadata.json holds no loss-scaler state, but this trainer "
                              "scales its loss: resuming would restart the scale from 1024.")
