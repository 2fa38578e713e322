"""The stack conformance case (inputs, oracle, check; rank side): a whole trainer under the stack contract
against the family's one-device module, every rank's dense state compared.

Inputs: the one-device model built from the spec (seed), one global batch of ``rows`` x ``SEQ`` tokens
(the same on every rank; the stack slices it), full or right-padded (targets ``IGNORE``: not counted).
Oracle: the one-device module trained on the whole batch with the same recipe — the mean cross-entropy over
every counted target, SGD with momentum (or Adam), each update at its learning rate (the recipe's schedule), global-norm
clipping at the recipe's ``max_grad_norm`` (``torch.nn.utils.clip_grad_norm_``); accumulation changes
nothing on one device (k passes over row blocks, each divided by the whole batch's counted targets, are the
whole batch's mean-loss gradient). Trained once per World by rank 0 and broadcast (``computed_once``).

Check, after step 1 and after the last: every parameter and every optimizer state tensor of the one-
device model, under its name, on every rank, within ``bound`` x its tensor's largest magnitude; no name
missing, none extra; the gradient norm (with clipping) within ``norm_bound``; the returned loss within
the step's bound.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from harness.runtime.rank import computed_once, rank_device
from reference.models.moe import zero_missing_grads
from reference.zero import Scheduled

from ..errors import describe
from ..verdict import attempt, checked, refusal, refused_by
from .inputs import SEQ, failed, failed_here, flat_state, global_batch, rows_for, seq_for  # noqa: F401 - failed: the suites' verdict of a failed call

U64, U32 = 2.0**-53, 2.0**-24
_ONE_DEVICE: dict = {}


def bound(step: int, tokens: int, spec, world: int) -> float:
    """Largest allowed difference from one device, relative to each tensor's largest magnitude — the 3D
    suite's derivation (``harness.threed.case.bound``) over the spec's sizes: the parallel run regroups
    sums over tokens (microbatches, replicas, accumulation passes), over hidden / ffn / vocabulary
    (tensor-parallel partial products, the vocabulary-parallel softmax) and across ranks, each within
    (tokens + hidden + ffn + vocab + world) u of the magnitudes summed; the backward chains ~16 ops per
    block (a Llama block's RMSNorms, rotary and SwiGLU product included) x layers, x 8 of margin; momentum
    sums past gradients (1 / (1 - 0.9) = 10, rounded to 16); each step adds its own: x step. u is the
    precision's unit roundoff (float64 or float32)."""
    u = U64 if spec.dtype == "float64" else U32
    return step * (tokens + spec.hidden + spec.ffn + spec.vocab + world) * u * 8 * spec.layers * 16


def norm_bound(step: int, tokens: int, spec, world: int, spread: float, numel: int) -> float:
    """|n' - n| / n: each gradient element within ``bound`` of its tensor's magnitude m_t, so the norms differ
    by at most bound x sqrt(sum_t n_t m_t^2) (``spread``, relative to n), plus the norm's own sum of ``numel``
    squares in another order (numel u)."""
    return bound(step, tokens, spec, world) * spread + numel * (U64 if spec.dtype == "float64" else U32)


def _one_device(spec, recipe, seed: int, tokens, targets, steps: int) -> list[dict]:
    model = spec.build(seed)
    opt = recipe.optimizer.build_named(model.named_parameters())
    out, muon = [], recipe.optimizer.name == "muon"
    lr = Scheduled(recipe.lr_schedule)
    for step in range(steps):
        model.dropout_key.step = step
        margin = model.routing_margin(tokens) if hasattr(model, "routing_margin") else math.inf
        opt.zero_grad()
        loss = model.loss(tokens, targets)
        loss.backward()
        zero_missing_grads(model.parameters())  # an expert no token reached: its momentum carries on
        grads = [p.grad for p in model.parameters()]
        before = [g.detach().double().clone() for g in grads] if muon else None  # before clipping
        spread = math.sqrt(sum(g.numel() * float(g.abs().max()) ** 2 for g in grads))
        norm = None
        if recipe.max_grad_norm is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm, recipe.norm_type))
        lr.before_update([opt])
        opt.step()
        lr.after_update()
        state = {n: {k: opt.state[p][k].detach().clone() for k in recipe.optimizer.state_keys_of(n, p.shape)}
                 for n, p in model.named_parameters()}
        out.append({"loss": float(loss.detach()), "norm": norm, "margin": margin,
                    **({"grads": before} if muon else {}),
                    "numel": sum(g.numel() for g in grads),
                    "spread": spread / max(norm or 1e-300, 1e-300) if norm else 0.0, "optimizer": state,
                    # state_dict's names: a tied head's weight under both of its names, as load_dense is given it
                    "params": {n: t.detach().clone() for n, t in model.state_dict().items()}})
    return out


def one_device(spec, recipe, seed: int, tokens, targets, steps: int) -> list[dict]:
    # the shape too: a (4, 4) and a (2, 8) batch drawn from one seed flatten to the same numbers
    key = (repr(spec), repr(recipe), seed, tuple(tokens.shape), tuple(tokens.flatten().tolist()),
           tuple(targets.flatten().tolist()), steps)
    return computed_once(_ONE_DEVICE, key, lambda: _one_device(spec, recipe, seed, tokens, targets, steps))


def differences(got: dict, want: dict, limit: float, what: str, floor: float = 0.0,
                slack: dict | None = None) -> tuple[float, list[str]]:
    """(largest relative difference, one line per tensor off, missing, extra or of the wrong shape); each
    tensor's difference relative to max(its largest magnitude, ``floor``). Where ``slack`` names it ((E_T, ratio):
    ``harness.stack.muon``, E_T a Frobenius norm) the difference's Frobenius norm may be ``limit`` x its magnitude x
    sqrt(its elements) (every element within the bound) + ratio x E_T; its relative difference is reported as that
    fraction of the allowance x ``limit``."""
    problems, worst = [], 0.0
    for name in sorted(set(want) - set(got)):
        problems.append(f"{what} {name}: missing from the dense state")
    for name in sorted(set(got) - set(want)):
        problems.append(f"{what} {name}: not a tensor of the one-device model")
    for name in sorted(set(want) & set(got)):
        g, w = got[name], want[name]
        if not torch.is_tensor(g) or tuple(g.shape) != tuple(w.shape):
            problems.append(f"{what} {name}: shape {tuple(getattr(g, 'shape', ()))} != {tuple(w.shape)}")
            continue
        mag = max(float(w.abs().max()), floor, 1e-300)
        off = g.detach().cpu().to(w.dtype) - w
        if slack is not None and name in slack:
            e_t, ratio = slack[name]
            diff, allowed = float(off.norm()), limit * mag * math.sqrt(w.numel()) + ratio * e_t
            rel = diff / max(allowed, 1e-300) * limit
            if not rel <= limit:  # NaN fails
                times = f" = {diff / e_t:.3g} E_T" if e_t > 0 else ""  # E_T 0: the iteration never reached it
                problems.append(f"{what} {name}: off by {diff:.3g} (Frobenius){times} > {limit:.3g} x {mag:.3g} x "
                                f"sqrt({w.numel()}) + {ratio:.3g} E_T (E_T = {e_t:.3g})")
        else:
            rel = float(off.abs().max()) / mag
            if not rel <= limit:  # NaN fails
                problems.append(f"{what} {name}: off by {rel:.3g} of its magnitude > {limit:.3g}")
        worst = max(worst, rel) if rel == rel else math.inf
    return worst, problems


def held(state: dict, want: dict, step: int, tokens: int, spec, n: int, slack: dict | None = None) -> tuple[
        float, list[str]]:
    """(worst, problem lines) of a stack's dense state after ``step`` against one device's ``want``: every
    parameter and optimizer state tensor within the step's bound, the gradient norm within ``norm_bound``.
    ``slack`` (a Muon recipe: ``harness.stack.muon.muon_slacks``) widens each tensor's and the norm's bound by its own
    amount."""
    slack = slack or {}
    step_limit = bound(step, tokens, spec, n)
    expected_state = flat_state(want["optimizer"])
    # optimizer state (SGD's momentum: the gradients) relative to the whole state's scale: a gradient that is zero
    # by structure (an attention key's bias: softmax is shift-invariant) is rounding noise at the scale of the
    # terms it sums, not at its own
    scale = max((float(t.abs().max()) for t in expected_state.values()), default=0.0)
    worst, problems = 0.0, []
    for what, got, expected, floor in (("parameter", state.get("params", {}), want["params"], 0.0),
                                       ("optimizer state", flat_state(state.get("optimizer", {})), expected_state,
                                        scale)):
        w, off = differences(got, expected, step_limit, what, floor, slack.get(what))
        worst, problems = max(worst, w), problems + off
    if want["norm"] is not None:
        got_norm = state.get("grad_norm")
        rel = abs(got_norm - want["norm"]) / want["norm"] if got_norm is not None else math.inf
        e_t, ratio = slack.get("norm", (0.0, 0.0))
        nb = norm_bound(step, tokens, spec, n, want["spread"], want["numel"]) + ratio * e_t / want["norm"]
        if not rel <= nb:
            problems.append(f"gradient norm {got_norm!r} vs one device {want['norm']!r} (off by {rel:.3g} > "
                            f"{nb:.3g})")
    return worst, problems


def muon_slacks_of(spec, recipe, seed: int, tokens, targets, want: list, layout) -> list[dict]:
    """Per step of one device's records ``want``, a Muon recipe's slack on ``layout`` (bfloat16 Newton-Schulz:
    ``harness.stack.muon``); none for another optimizer."""
    if recipe.optimizer.name != "muon":
        return [{}] * len(want)
    from .muon import exact_recipe, muon_slacks

    return muon_slacks(want, one_device(spec, exact_recipe(recipe), seed, tokens, targets, len(want)), layout)


def train_stack(impl_spec: str, spec, layout, recipe, steps: int = 2, seed: int = 0, rows: int | None = None,
                seq: int | None = None, padded: bool = False, **mixed) -> dict:
    """Rank side: ``impl_spec``'s stack on ``layout`` against one device (a bfloat16 / float16 spec:
    ``harness.stack.mixed``, precision-matched; ``mixed``: its keywords); ``padded``: a right-padded batch
    (``harness.stack.inputs.global_batch``). Returns {"refused", "unsupported", "problems", "worst", "bound",
    "losses"}."""
    from harness.records import registry

    low = spec.dtype in ("bfloat16", "float16") or recipe.low_precision is not None
    if low and rows is None and seq is None:  # fp32 masters / a float8 recipe: precision-matched
        from .mixed import train_stack_mixed

        return train_stack_mixed(impl_spec, spec, layout, recipe, steps, seed, padded=padded, **mixed)
    n, r = dist.get_world_size(), dist.get_rank()
    rows = rows or rows_for(layout, recipe)
    tokens, targets = global_batch(spec.vocab, rows, seed, seq or seq_for(layout), padded)
    impl = registry.load(impl_spec, "stack")
    trainer, declined = attempt("build", impl.build, spec, layout, recipe, rank=r, losses=[])
    if declined:
        return declined
    want = one_device(spec, recipe, seed, tokens, targets, steps)  # after build: a refusal costs no oracle
    slacks = muon_slacks_of(spec, recipe, seed, tokens, targets, want, layout)
    device = rank_device()
    problems, worst, losses = [], 0.0, []
    limit = bound(steps, tokens.numel(), spec, n)
    try:
        trainer.load_dense(spec.build(seed).state_dict())
    except Exception as exc:  # noqa: BLE001 - after build, any exception is the stack's failure
        return failed_here(f"rank {r}: load_dense raised {describe(exc)}")
    try:
        for k in range(steps):
            losses.append(float(trainer.step(tokens.to(device), targets.to(device))))
            if k in (0, steps - 1):
                w, off = held(trainer.dense_state(), want[k], k + 1, tokens.numel(), spec, n, slacks[k])
                worst, problems = max(worst, w), problems + [f"rank {r}: step {k + 1}: {p}" for p in off]
    except ValueError as exc:  # the contract's refusal of a batch it cannot split (one sentence), at step 1
        if losses:
            return failed_here(f"rank {r}: step {len(losses) + 1} raised {describe(exc)}")
        return refusal(str(exc))
    except Exception as exc:  # noqa: BLE001 - the stack's failure is a verdict; peers inside it are ended
        return failed_here(f"rank {r}: {describe(exc)} (after {len(losses)} step(s))")
    for k, (a, b) in enumerate(zip(losses, [w["loss"] for w in want], strict=False)):
        e_t, ratio = slacks[k].get("loss", (0.0, 0.0))
        if not abs(a - b) <= bound(k + 1, tokens.numel(), spec, n) * abs(b) + ratio * e_t:
            problems.append(f"rank {r}: loss after step {k + 1}: {a!r} vs one device {b!r}")
    return checked(problems, worst, limit, losses=losses, margin=min(w["margin"] for w in want))


def resume_stack(impl_spec: str, spec, layout_a, layout_b, recipe, directory: str, seed: int = 0) -> dict:
    """Rank side: one step on ``layout_a``, ``save(directory)``; a new trainer on ``layout_b``,
    ``load(directory)``, one more step (two under a learning-rate schedule): its dense state against one device
    after as many. A stack without ``save`` / ``load`` is unsupported for resume; under a learning-rate schedule, one
    whose trainer does not declare ``resumes_lr_schedule`` (its scheduler's position carried through them) too."""
    from harness.records import registry

    r, n = dist.get_rank(), dist.get_world_size()
    rows = math.lcm(*(rows_for(lay, recipe) for lay in (layout_a, layout_b)))
    tokens, targets = global_batch(spec.vocab, rows, seed, seq_for(layout_a, layout_b))
    # under a schedule two steps after the load: a stack restoring the optimizer's lr but not its scheduler's
    # position trains the first one right and the second at the restarted schedule's
    steps = 3 if recipe.lr_schedule is not None else 2
    records = one_device(spec, recipe, seed, tokens, targets, steps)
    from .muon import ratio

    # the more split layout's ratio: each step's iteration ran on one of them
    want, slack = records[-1], muon_slacks_of(spec, recipe, seed, tokens, targets, records,
                                              max((layout_a, layout_b), key=ratio))[-1]
    impl, device = registry.load(impl_spec, "stack"), rank_device()
    try:
        first = impl.build(spec, layout_a, recipe)
        if not (callable(getattr(first, "save", None)) and callable(getattr(first, "load", None))):
            return refusal(f"{impl_spec} has no save / load: resume is unsupported.", unsupported=True)
        if recipe.lr_schedule is not None and not getattr(first, "resumes_lr_schedule", False):
            return refusal(f"{impl_spec} does not carry its learning-rate scheduler's position through save / load "
                           "(resumes_lr_schedule): resume under a schedule is unsupported.", unsupported=True)
        first.load_dense(spec.build(seed).state_dict())
        first.step(tokens.to(device), targets.to(device))
        first.save(directory)
        second = impl.build(spec, layout_b, recipe)
        second.load(directory)
        for _ in range(steps - 1):
            second.step(tokens.to(device), targets.to(device))
        state = second.dense_state()
    except Exception as exc:  # noqa: BLE001 - the stack's failure is a verdict
        return refused_by(exc, refusals=()) or failed_here(f"rank {r}: {describe(exc)}")
    limit = bound(steps, tokens.numel(), spec, n)
    expected_state = flat_state(want["optimizer"])
    scale = max((float(t.abs().max()) for t in expected_state.values()), default=0.0)
    worst, problems = differences(state.get("params", {}), want["params"], limit, "parameter",
                                  slack=slack.get("parameter"))
    w, off = differences(flat_state(state.get("optimizer", {})), expected_state, limit, "optimizer state", scale,
                         slack.get("optimizer state"))
    return checked([f"rank {r}: after resuming: {p}" for p in problems + off], max(worst, w), limit)
