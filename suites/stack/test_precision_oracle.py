"""The low-precision seam's own oracle (harness/stack/mixed.py, harness/stack/adam_replay.py), without a World: one
device's per-step exact state, and Adam's step replayed from a stack's own state — torch's fp32 Adam passes it,
each way of getting Adam's step wrong fails it."""

from __future__ import annotations

import math

import pytest
import torch

from harness.contracts.stack import ModelSpec, Recipe
from harness.stack import adam_replay
from harness.stack.inputs import global_batch
from harness.stack.mixed import _oracle
from harness.stack.precision import OneDevice
from reference.zero import OptimizerSpec

ADAM = OptimizerSpec("adam", lr=0.01, eps=1e-3)
SMALL = ModelSpec("llama", vocab=13, hidden=16, heads=4, kv_heads=2, ffn=24, layers=2, dtype="bfloat16")


def test_each_steps_exact_state_is_that_steps():
    """The float64 run's masters are its live parameters: step 1's exact state must not be moved by step 2 (it was,
    and step 1's masters were held against a whole step's update). Bitwise: the same float64 arithmetic."""
    tokens, targets = global_batch(SMALL.vocab, 4, 0, 8, True)
    two = _oracle(SMALL, Recipe(optimizer=ADAM), 0, tokens, targets, 2)
    one = OneDevice(SMALL.build(0).double(), None, ADAM)
    one.step(0, tokens, targets, None)
    first = one.dense()
    assert set(first) == set(two[0]["exact"])
    assert all(torch.equal(first[n], two[0]["exact"][n]) for n in first)
    assert not all(torch.equal(two[0]["exact"][n], two[1]["exact"][n]) for n in first)  # step 2 moved them


def _torch_adam(steps: int, seed: int = 0, mutate=None):
    """(every step's {"params", "optimizer"} as the seam reads a stack's, the initial weights) of torch's fp32 Adam
    over three tensors — a norm-like vector with a gradient near 0, a matrix, a scalar-sized one — on random
    gradients; ``mutate(k, param, state)`` after step k: a plant."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {"norm.weight": (16,), "mlp.weight": (8, 4), "bias": (1,)}
    params = {n: torch.nn.Parameter(torch.randn(s, generator=gen)) for n, s in shapes.items()}
    init = {n: p.detach().double().clone() for n, p in params.items()}
    opt = torch.optim.Adam(params.values(), lr=ADAM.lr, betas=ADAM.betas, eps=ADAM.eps)
    out = []
    for k in range(1, steps + 1):
        for n, p in params.items():
            p.grad = torch.randn(p.shape, generator=gen) * 1e-2
            if n == "norm.weight":
                p.grad[3] = 1e-7  # Adam's update is most sensitive here: lr x error / eps
        opt.step()
        if mutate:
            for p in params.values():
                mutate(k, p, opt.state[p])
        out.append({"params": {n: p.detach().double().clone() for n, p in params.items()},
                    "optimizer": {f"{n}/{key}": opt.state[p][key].detach().double().clone()
                                  for n, p in params.items() for key in ("exp_avg", "exp_avg_sq")}})
    return out, init


def _replayed(states, init, ties=None) -> list[str]:
    prev, lines = {"params": init, "optimizer": {}}, []
    for k, state in enumerate(states, start=1):
        lines += adam_replay.problems(ADAM, k, prev, state, list(init), ties or {})
        prev = state
    return lines


@pytest.mark.parametrize("seed", range(4))
def test_torchs_fp32_adam_is_its_own_replay(seed):
    """torch's Adam in fp32 (what every stack here steps with) against the replay in float64 from its own state:
    within fp32's rounding of each element's step, over five steps."""
    states, init = _torch_adam(5, seed)
    assert _replayed(states, init) == []


def _restep(p, s, denom, size):
    """Undo torch's update of ``p`` and apply another Adam's: step size ``size(bc1)``, denominator ``denom(v, bc2)``."""
    b1, b2 = ADAM.betas
    k = int(s["step"])
    bc1, bc2 = 1 - b1 ** k, 1 - b2 ** k
    m, v = s["exp_avg"], s["exp_avg_sq"]
    before = p.data + ADAM.lr / bc1 * m / ((v / bc2).sqrt() + ADAM.eps)
    p.data.copy_(before - size(bc1) * m / denom(v, bc2))


PLANTS = {  # what a stack gets wrong -> the change after torch's step k
    "the second moment of a replica's gradient before the reduction (half of it)":
        lambda k, p, s: s["exp_avg_sq"].sub_(0.75 * (1 - ADAM.betas[1]) * p.grad ** 2) if k == 2 else None,
    "the master rounded to bfloat16 after each step":
        lambda k, p, s: p.data.copy_(p.data.bfloat16().float()),
    "eps inside the square root":
        lambda k, p, s: _restep(p, s, lambda v, bc2: (v / bc2 + ADAM.eps).sqrt(), lambda bc1: ADAM.lr / bc1),
    "no bias correction":
        lambda k, p, s: _restep(p, s, lambda v, bc2: v.sqrt() + ADAM.eps, lambda bc1: ADAM.lr),
}


@pytest.mark.parametrize("what", list(PLANTS))
def test_each_wrong_step_fails_the_replay(what):
    """Each way of getting Adam's step wrong fails the replay, its first line naming the tensor and the step."""
    states, init = _torch_adam(4, 1, PLANTS[what])
    lines = _replayed(states, init)
    assert lines and ": not Adam's step " in lines[0], what


def test_a_stale_second_moment_fails_the_replay():
    states, init = _torch_adam(2, 2)
    states[1]["optimizer"] = {**states[1]["optimizer"], **{n: t for n, t in states[0]["optimizer"].items()
                                                           if n.endswith("exp_avg_sq")}}
    assert any(line.startswith("second moment") for line in _replayed(states, init))


def test_a_master_off_by_one_element_names_it():
    states, init = _torch_adam(2, 3)
    states[1]["params"]["mlp.weight"][2, 1] += 1e-5  # a hundredth of the update
    lines = _replayed(states, init)
    assert len(lines) == 1 and lines[0].startswith("master mlp.weight: not Adam's step 2") and "element 9" in lines[0]


def test_nan_missing_state_a_wrong_shape_and_an_untied_tie_fail():
    states, init = _torch_adam(1, 4)
    nan = {"params": {**states[0]["params"], "bias": torch.tensor([math.nan], dtype=torch.float64)},
           "optimizer": states[0]["optimizer"]}
    assert any("master bias" in line for line in _replayed([nan], init))
    missing = {"params": states[0]["params"],
               "optimizer": {n: t for n, t in states[0]["optimizer"].items() if not n.startswith("bias/")}}
    assert _replayed([missing], init) == [
        "master bias: missing from the dense state, or its Adam state (exp_avg, exp_avg_sq)"]
    tied = {"params": {**states[0]["params"], "head.weight": states[0]["params"]["norm.weight"].clone()},
            "optimizer": states[0]["optimizer"]}
    assert _replayed([tied], init, {"head.weight": "norm.weight"}) == []
    tied["params"]["head.weight"][0] += 1e-6
    assert _replayed([tied], init, {"head.weight": "norm.weight"}) == ["master head.weight: not norm.weight, which "
                                                                       "it is tied to"]
    flat = {"params": {**states[0]["params"], "mlp.weight": states[0]["params"]["mlp.weight"].flatten()},
            "optimizer": states[0]["optimizer"]}
    assert _replayed([flat], init) == ["master mlp.weight: shape (32,), its Adam state's (8, 4) and (8, 4), the "
                                       "parameter's (8, 4)"]
