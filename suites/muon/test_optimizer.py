"""``OptimizerSpec("muon", ...)``: the stacks' Muon (``reference.muon.optimizer.MuonAdamW``) — which parameters it
takes, its state per parameter, its one sentence for what it is not given; its reference iteration (the one that
gathers split matrices, and the float64 one a Muon case's E_T is measured from) is torch's Muon bit for bit in
bfloat16."""

from __future__ import annotations

import pytest
import torch

from reference.models import ModelSpec
from reference.zero import OptimizerSpec

SPEC = ModelSpec("llama", vocab=32, hidden=16, heads=4, kv_heads=2, ffn=24, layers=2)
MUON = OptimizerSpec("muon", 0.02, momentum=0.95, weight_decay=0.1, adamw_lr=1e-2)


def _trained(spec: OptimizerSpec, force_reference: bool = False, steps: int = 3, schedule=None) -> dict:
    """``schedule``: a ``reference.zero.LRSchedule`` setting every group's lr before each step, as a scheduler does."""
    from reference.muon.optimizer import MuonAdamW, ReferenceMatrices
    from reference.zero import Scheduled

    model = SPEC.build(0)
    if force_reference:  # the reference iteration in bfloat16 in torch's Muon's place
        opt = MuonAdamW(model.named_parameters(), spec.muon(), torch.bfloat16, reference=True)
        assert isinstance(opt.matrices, ReferenceMatrices)
    else:
        opt = spec.build_named(model.named_parameters())
        assert isinstance(opt, MuonAdamW)  # torch's Muon where it is torch's iteration, the reference otherwise
        from reference.muon.spec import torch_adjusts

        assert isinstance(opt.matrices, torch.optim.Muon) == (spec.ns_dtype == "bfloat16"
                                                              and torch_adjusts(spec.adjust_lr_fn))
    tokens = torch.randint(0, SPEC.vocab, (4, 8), generator=torch.Generator().manual_seed(1))
    lr = Scheduled(schedule)
    for _ in range(steps):
        opt.zero_grad()
        model.loss(tokens, tokens.roll(-1, 1)).backward()
        lr.before_update([opt])
        opt.step()
        lr.after_update()
    state = {n: {k: opt.state[p][k].clone() for k in spec.state_keys_of(n, p.shape)}
             for n, p in model.named_parameters()}
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()}, "state": state}


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    model = SPEC.build(0)
    taken = {n for n, p in model.named_parameters() if MUON.takes_muon(n, p.shape)}
    assert taken == {f"blocks.{i}.{m}.weight" for i in range(2)
                     for m in ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.gate", "mlp.up", "mlp.down")}
    assert MUON.state_keys_of("blocks.0.attn.q.weight", (16, 16)) == ("momentum_buffer",)
    assert MUON.state_keys_of("embed.weight", (32, 16)) == ("exp_avg", "exp_avg_sq")
    assert MUON.extra_state_of("head.weight", (32, 16)) == ("step",) and MUON.extra_state_of("x.weight", (4, 4)) == ()
    assert OptimizerSpec("adam", 1e-3).state_keys_of("blocks.0.attn.q.weight", (16, 16)) == ("exp_avg", "exp_avg_sq")


@pytest.mark.parametrize("adjust", [None, "match_rms_adamw", "spectral_unclamped"])
def test_the_reference_iteration_is_torchs_muon_bit_for_bit(adjust):
    """Three steps of a Llama: torch's Muon (what ``build_named`` gives one device) and the reference iteration in
    bfloat16 (what the reference stack gathers into) leave the same bits in every parameter and state tensor — under
    each learning-rate adjustment torch has (torch 2.15's "spectral_unclamped": the compat-newest env)."""
    from dataclasses import replace

    from reference.muon.spec import torch_lacks

    if why := torch_lacks(adjust):
        pytest.skip(why)
    spec = replace(MUON, adjust_lr_fn=adjust)
    torchs, ours = _trained(spec), _trained(spec, force_reference=True)
    for name, p in torchs["params"].items():
        assert torch.equal(p, ours["params"][name]), name
        for key, t in torchs["state"][name].items():
            assert torch.equal(t, ours["state"][name][key]), (name, key)


def test_the_reference_iteration_follows_a_schedule_as_torchs_muon_does():
    """Under a learning-rate schedule (0.5, 1, 0.325 of lr: a warmup, the peak, a cosine) the reference iteration reads
    its group's lr as torch's Muon does — for the decay (1 - lr x wd) and the shape-adjusted lr — bit for bit; the
    float64 iteration a Muon case's E_T is measured from is this code, so a reference that stepped at the spec's lr
    would move one device's exact run with it and widen the slack instead of failing (the stack cases alone would not
    see it: this test does)."""
    from reference.zero import LRSchedule

    plan = LRSchedule(warmup=1, start=0.5, decay="cosine", total=3, min_ratio=0.1)
    torchs, ours = _trained(MUON, schedule=plan), _trained(MUON, force_reference=True, schedule=plan)
    unscheduled = _trained(MUON)
    for name, p in torchs["params"].items():
        assert torch.equal(p, ours["params"][name]), name
        for key, t in torchs["state"][name].items():
            assert torch.equal(t, ours["state"][name][key]), (name, key)
    assert all(not torch.equal(p, unscheduled["params"][n]) for n, p in torchs["params"].items())  # it took effect


def test_the_float64_iteration_is_another_run():
    """``ns_dtype="float64"`` (the E_T run) changes every Muon matrix and no AdamW parameter after one step."""
    from dataclasses import replace

    a, b = _trained(MUON, steps=1), _trained(replace(MUON, ns_dtype="float64"), steps=1)
    for name, p in a["params"].items():
        same = torch.equal(p, b["params"][name])
        assert same != MUON.takes_muon(name, p.shape), name


@pytest.mark.parametrize("kwargs, sentence", [
    ({"name": "sgd", "lr": 0.1, "weight_decay": 0.1}, "weight_decay is AdamW's and Muon's"),
    ({"name": "muon", "lr": 0.02, "adjust_lr_fn": "spectral"}, "adjust_lr_fn must be"),
    ({"name": "muon", "lr": 0.02, "ns_dtype": "float16"}, "ns_dtype must be one of"),
])
def test_a_muon_spec_it_cannot_build_is_one_sentence(kwargs, sentence):
    with pytest.raises(ValueError, match=sentence):
        OptimizerSpec(**kwargs)


def test_muon_without_names_is_one_sentence():
    with pytest.raises(ValueError, match="build_named"):
        MUON.build(SPEC.build(0).parameters())
    with pytest.raises(ValueError, match="per parameter"):
        MUON.state_bytes_per_param(4)


def test_spectral_unclamped_scales_by_the_shape_unclamped():
    """torch 2.15's "spectral_unclamped": lr x sqrt(A / B) — below lr for a wide matrix, where "original" clamps."""
    from dataclasses import replace

    spec = replace(MUON, adjust_lr_fn="spectral_unclamped").muon()
    assert spec.adjusted_lr((4, 16)) == pytest.approx(0.02 * 0.5, rel=1e-15)
    assert spec.adjusted_lr((16, 4)) == pytest.approx(0.02 * 2.0, rel=1e-15)
    assert MUON.muon().adjusted_lr((4, 16)) == 0.02


def test_where_torch_lacks_an_adjustment_one_device_is_the_reference_iteration():
    """On a torch without "spectral_unclamped" (before 2.15) the spec still builds: ``build_named`` gives the reference
    iteration (bitwise torch's where both run), and torch's own adapters say why they cannot."""
    from dataclasses import replace

    from reference.muon.optimizer import ReferenceMatrices
    from reference.muon.spec import torch_lacks

    spec = replace(MUON, adjust_lr_fn="spectral_unclamped")
    why = torch_lacks("spectral_unclamped")
    if why is None:
        pytest.skip(f"torch {torch.__version__}'s Muon has spectral_unclamped: the bitwise test holds it")
    assert "2.15" in why and "\n" not in why
    opt = spec.build_named(SPEC.build(0).named_parameters())
    assert isinstance(opt.matrices, ReferenceMatrices)
