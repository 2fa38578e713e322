"""harness.runtime.gloo_device: a World's ranks build every gloo group on one transport device, so the groups a
session leaves behind cost no CPU while idle (each device's loop thread wakes every 10 ms), and the
groups compute what they computed before."""

from __future__ import annotations

import types

import torch.distributed.distributed_c10d as c10d

from harness.runtime import gloo_device

from . import ranks


def test_new_groups_share_the_ranks_one_device_and_reduce_exactly(world_cache, world_sizes):
    n = max(world_sizes)
    for r, got in enumerate(world_cache.get(n).run(ranks.groups_on_one_device, 6)):
        # 12 more gloo groups on the one device the World's own group made (gloo), or the first of them made (under
        # nccl the World's group has none); torch alone adds a device thread each. (A torch that does not name gloo's
        # threads — the declared floor's — counts none before or after.)
        assert got["before"] <= got["after"] <= max(got["before"], 1), got
        want = [(n, n * (n + 1) / 2)] * 6 + ([(2, 3.0)] * 6 if r < 2 and n > 1 else [])
        assert got["sums"] == want, (r, got["sums"])
        assert got["isinstance"], "a gloo backend torch builds itself fails torch's isinstance check"


def test_a_torch_whose_gloo_classes_differ_is_left_as_it_is(monkeypatch):
    odd = type("ProcessGroupGloo", (), {})  # no _Options / create_device: another torch's layout
    monkeypatch.setattr(c10d, "ProcessGroupGloo", odd)
    assert gloo_device.share() is False and c10d.ProcessGroupGloo is odd
    monkeypatch.delattr(c10d, "ProcessGroupGloo")  # a torch built without gloo
    assert gloo_device.share() is False and not hasattr(c10d, "ProcessGroupGloo")
    monkeypatch.setattr(c10d, "ProcessGroupGloo", types.SimpleNamespace(_paritybench_shared=True), raising=False)
    assert gloo_device.share() is True  # already in place: nothing done twice


def test_a_keyword_the_shared_device_cannot_serve_falls_back_to_torch_s_own_constructor(world_cache):
    """On any torch: asked for what its options leave at their default (enable_reconfigure=True on 2.14+, an
    unknown keyword before), the constructor builds the group exactly as torch's own does — the same group
    on a device of its own, or torch's own refusal — and records why once."""
    for keyword in ("enable_reconfigure", "paritybench_no_such_option"):
        for got in world_cache.get(2).run(ranks.gloo_fallback_matches_torch, keyword):
            assert got["shared"] == got["torch"], got
            assert any(keyword in why for why in got["fallbacks"]), got["fallbacks"]


def test_which_constructor_calls_the_shared_device_serves():
    options = types.SimpleNamespace(enable_reconfigure=False, _timeout=None)
    minute = gloo_device.timedelta(minutes=1)
    assert gloo_device.unshareable(minute, {}, options) is None
    assert gloo_device.unshareable(minute, {"enable_reconfigure": False}, options) is None  # torch 2.14's default
    assert "enable_reconfigure=True" in gloo_device.unshareable(minute, {"enable_reconfigure": True}, options)
    assert "'rebuild'" in gloo_device.unshareable(minute, {"rebuild": False}, options)
    assert "options overload" in gloo_device.unshareable(options, {}, options)
