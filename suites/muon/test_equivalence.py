"""Muon under sharding equals one device running torch's Muon: three steps of a small model's parameters — Muon for
the hidden matrices (a fused QKV and gate + up orthogonalised per part), AdamW for the embedding, the head and the
norm — from the same gradients, over every layout (replicated, rows, cols, flat ZeRO shards straddling parameters)
at 2 and 4 ranks, a matrix of 10 rows uneven over 4, Nesterov and plain momentum, torch's two learning-rate
adjustments. The bound (harness/muon/case.py): 1 + 2 sqrt(2 + 2n) E_T per tensor; the reference, which runs the same
arithmetic on the same whole matrices, is held bitwise."""

from __future__ import annotations

import pytest

from harness.muon.case import Case
from suites._support.layers import judge_muon as judge

CASES = [
    Case("replicated", 2), Case("rows", 2), Case("cols", 2), Case("flat", 2),
    Case("rows", 4), Case("cols", 4, nesterov=False), Case("flat", 4, adjust_lr_fn="match_rms_adamw"),
    Case("rows", 2, fused=False), Case("cols", 4, fused=False, adjust_lr_fn="original"),
    Case("rows", 4, fused=False, nesterov=False),
]
THOROUGH = {"rows-n2-fused", "cols-n2-fused", "rows-n2-split"}
"""tox's budget: the 2-rank rows / cols cases (their 4-rank siblings run in tox; flat and replicated at 2 too)."""


@pytest.mark.parametrize("case", [pytest.param(c, id=c.label(), marks=[pytest.mark.thorough] if c.label() in THOROUGH
                                               else []) for c in CASES])
def test_muon_equals_one_device(muon_impl, case, world_cache, conformance):
    outcome, refused, problems, per_rank = judge(world_cache, conformance, muon_impl, case)
    if outcome == "unsupported":
        pytest.skip(f"{muon_impl} does not provide this case: {refused}")
    assert outcome == "pass", problems[:4] or refused
    if muon_impl == "reference":  # the same arithmetic on the same matrices: the same bits
        assert all(r["bitwise"] for r in per_rank), per_rank[0]


def test_the_oracle_is_torchs_muon_bit_for_bit():
    """``reference.muon.one_device`` on unfused matrices (tall, wide, 10 x 6) is ``torch.optim.Muon``, bitwise, over
    three steps — so the suite's one device is torch's algorithm, parts aside."""
    import torch

    from reference.muon import MuonSpec, one_device

    gen = torch.Generator().manual_seed(1)
    for shape in ((16, 8), (8, 12), (10, 6)):
        w = torch.randn(*shape, generator=gen)
        grads = [{"w": torch.randn(*shape, generator=gen)} for _ in range(3)]
        spec = MuonSpec(adjust_lr_fn="match_rms_adamw")
        ours = one_device({"w": w}, grads, spec)
        p = torch.nn.Parameter(w.clone())
        opt = torch.optim.Muon([p], lr=spec.lr, weight_decay=spec.weight_decay, momentum=spec.momentum,
                               adjust_lr_fn="match_rms_adamw")
        for g, o in zip(grads, ours, strict=True):
            p.grad = g["w"].clone()
            opt.step()
            assert torch.equal(p.detach(), o["w"]), (shape, float((p.detach() - o["w"]).abs().max()))


def test_the_fused_parts_change_the_update():
    """Orthogonalised per part is not orthogonalised whole (else the fused case could not tell them apart)."""
    import dataclasses

    from harness.muon.case import inputs
    from reference.muon import one_device

    case = Case()
    params, grads = inputs(case)
    spec = case.spec()
    per_part = one_device(params, grads, spec)[0]
    whole = one_device(params, grads, dataclasses.replace(spec, parts={}))[0]
    name = "blocks.0.attn.qkv.weight"
    assert float((per_part[name] - whole[name]).abs().max()) > 1e-3


PLANTED = [("LocalNewtonSchulz", Case("rows", 2)), ("FusedAsOne", Case("replicated", 2)),
           ("AdamWForMatrices", Case("flat", 2))]


@pytest.mark.parametrize("name, case", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_bugs_fail(name, case, world_cache, conformance):
    outcome, refused, problems, _ = judge(world_cache, conformance, f"suites.muon.planted:{name}", case)
    assert outcome == "fail" and all("E_T" in p for p in problems), (outcome, refused, problems[:3])
