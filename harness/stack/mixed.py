"""The stack's low-precision seam (rank side): a bfloat16 / float16 spec trains with fp32 master weights and
fp32 optimizer state (the contract's only low-precision recipe); every rank's dense state — the masters and
their optimizer state — is held to one device running the same recipe on the whole batch, precision-matched
as the mixed-precision suites hold theirs: within ``allowed_ratio`` x E_T, where E_T is one device's own
distance from exact arithmetic (the same recipe in float64, from the same rounded initial weights) over the
dense tensor T (derivation: ``harness.stack.precision.allowed_ratio``).

One device: ``harness.stack.precision.OneDevice`` (low-precision forward and backward, the cross-entropy in
fp32, the gradients upcast into the fp32 masters, torch's ``clip_grad_norm_`` on the masters, the
optimizer on the masters, the masters rounded back into the model). The gradient norm is held to
|n' - n| <= ratio x |g - g_exact| (a norm moves by at most the 2-norm of its argument's change).

Adam: the bound holds its first moments (linear in the gradients); its masters and second moments are replayed
from the stack's own state (``harness.stack.adam_replay``: why the bound cannot hold them). E_T is each step's: the
exact run's state is copied at every step (``OneDevice.dense``)."""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist

from harness.runtime.rank import computed_once, rank_device

from ..contracts.stack import Layout
from ..errors import describe
from ..verdict import attempt, checked
from . import adam_replay
from .casts import counter
from .inputs import failed_here, flat_state, global_batch, rows_for, seq_for
from .precision import OneDevice, allowed_ratio

_ORACLES: dict = {}


def _oracle(spec, recipe, seed: int, tokens, targets, steps: int) -> list[dict]:
    """Per step: one device's recipe on the whole batch ("params", "optimizer", its gradient norm), in float64
    ("exact", "exact_optimizer") and "e_t", each dense tensor's E_T (``rounding_scale``)."""
    from reference.mixed_precision import DynamicLossScaler

    scaler = DynamicLossScaler(recipe.loss_scale, growth_interval=recipe.growth_interval) \
        if recipe.loss_scale is not None else None
    model = spec.build(seed)
    if recipe.low_precision is not None:  # the blocks' linear layers under the recipe, every amax whole
        from reference.low_precision.convert import to_recipe

        to_recipe(model, recipe.low_precision)
    single = OneDevice(model, scaler, recipe.optimizer, recipe.lr_schedule)
    exact = OneDevice(spec.build(seed).double(), None, recipe.optimizer, recipe.lr_schedule)  # the same rounded weights
    clip = (recipe.max_grad_norm, recipe.norm_type) if recipe.max_grad_norm is not None else None
    keys, out = recipe.optimizer.state_keys, []
    for step in range(steps):
        single.step(step, tokens, targets, clip)
        exact.step(step, tokens, targets, clip, skip=not single.applied)  # the same updates skipped: exact arithmetic
        moved = math.sqrt(sum(float(((a - b) ** 2).sum()) for a, b in zip(single.grads, exact.grads, strict=True)))
        params, optimizer = single.dense(), single.dense_optimizer(keys)
        want = {"exact": exact.dense(), "exact_optimizer": exact.dense_optimizer(keys)}
        out.append({"norm": single.norm, "norm_scale": moved, "params": params, "optimizer": optimizer, **want,
                    "lr": recipe.optimizer.lr * single.lr_factor, "applied": single.applied,
                    "updates": single.lr.taken,
                    "e_t": _scales(params, optimizer, want)})
    return out


def rounding_scale(run: dict, exact: dict) -> dict[str, float]:
    """E_T per tensor name: one device's (``run``'s) largest distance from ``exact``, the dense tensors by name."""
    return {name: float((run[name].double() - exact[name]).abs().max()) for name in set(run) & set(exact)}


def _scales(params: dict, optimizer: dict, want: dict) -> dict[str, dict[str, float]]:
    """E_T of a one-device run's masters and optimizer state ({name: {key: tensor}}) against the oracle's exact
    ones (``want``: "exact", "exact_optimizer"), by what ``_against`` calls them."""
    return {"master": rounding_scale(params, want["exact"]),
            "optimizer state": rounding_scale(flat_state(optimizer), flat_state(want["exact_optimizer"]))}


def _against(got: dict, single: dict, scale: dict, ratio: float, what: str) -> tuple[float, list[str]]:
    """(largest |got - one device| / E_T, one line per tensor beyond ``ratio`` x E_T, missing or extra); ``scale``:
    E_T by name."""
    problems, worst = [], 0.0
    problems += [f"{what} {n}: missing from the dense state" for n in sorted(set(single) - set(got))]
    problems += [f"{what} {n}: not a tensor of the one-device model" for n in sorted(set(got) - set(single))]
    for name in sorted(set(single) & set(got)):
        g, w = got[name], single[name]
        if not torch.is_tensor(g) or tuple(g.shape) != tuple(w.shape):
            problems.append(f"{what} {name}: shape {tuple(getattr(g, 'shape', ()))} != {tuple(w.shape)}")
            continue
        e_t = scale.get(name, 0.0)
        diff = float((g.detach().cpu().double() - w).abs().max())
        rel = diff / max(e_t, 1e-300)
        worst = max(worst, rel) if rel == rel else math.inf
        if not diff <= ratio * e_t:  # NaN fails
            problems.append(f"{what} {name}: off by {diff:.3g} = {rel:.3g} E_T > {ratio:.3g} E_T (E_T = {e_t:.3g})")
    return worst, problems


def seq_of(layout, recipe) -> int:
    """The case's sequence length, a multiple of the recipe's blocks where it has them: MXFP8's weight-gradient GEMM
    scales blocks of 32 tokens, so every micro-batch's rows (seq tokens each) tile them whole, on one device and on
    any layout that splits the batch by rows."""
    from reference.low_precision import recipe as low_precision

    block = low_precision(recipe.low_precision).block if recipe.low_precision else None
    return math.lcm(seq_for(layout), block or 1)


def train_stack_mixed(impl_spec: str, spec, layout, recipe, steps: int = 2, seed: int = 0, single=None,
                      batch_of=None, keep: bool = False, padded: bool = False) -> dict:
    """Rank side: ``impl_spec``'s stack on ``layout`` for a low-precision ``spec``, against one device's
    recipe. Returns what ``harness.stack.case.train_stack`` returns; ``bound`` is the ratio to E_T.

    ``single``: the stack's own one-device run of this batch (``harness.stack.own_recipe``: per step its
    dense state, itself held to the contract's recipe) in place of the contract's — each tensor's E_T then its
    distance from exact arithmetic. ``batch_of``: the layout whose global batch to train (default ``layout``);
    ``keep``: return each step's dense state as "states"; ``padded``: a right-padded batch."""
    from harness.records import registry

    r, batch = dist.get_rank(), batch_of or layout
    rows = rows_for(batch, recipe)
    tokens, targets = global_batch(spec.vocab, rows, seed, seq_of(batch, recipe), padded)
    key = (repr(spec), repr(recipe), seed, tuple(tokens.shape), padded, steps)
    want = computed_once(_ORACLES, key, lambda: _oracle(spec, recipe, seed, tokens, targets, steps))
    ratio = allowed_ratio(layout.num_microbatches, recipe.accumulation, layout.dp, layout.tp)
    own_ratio = allowed_ratio(Layout().num_microbatches, recipe.accumulation, 1, 1)  # what held ``single``
    trainer, declined = attempt("build", registry.load(impl_spec, "stack").build, spec, layout, recipe, rank=r,
                                losses=[])
    if declined:
        return declined
    problems, worst, losses, states, device = [], 0.0, [], [], rank_device()
    casts = counter() if recipe.low_precision else None
    adam = recipe.optimizer.adam  # Adam or AdamW
    try:
        model = spec.build(seed)
        trainer.load_dense(model.state_dict())
        prev = {"params": dense64({"params": dict(model.named_parameters(remove_duplicate=False))})["params"],
                "optimizer": {}} if adam else None  # Adam's replay starts from the loaded weights
        for k in range(steps):
            with casts if recipe.low_precision else contextlib.nullcontext():
                losses.append(float(trainer.step(tokens.to(device), targets.to(device))))
            state = trainer.dense_state()
            states += [state] if keep else []
            one = _one_device(want[k], single[k], own_ratio) if single else want[k]
            mine = {"params": state.get("params", {}), "optimizer": flat_state(state.get("optimizer", {}))}
            now = dense64(mine) if adam else None
            # an update the loss scaler skipped is not replayed: its masters are held as they are (unmoved)
            replay = adam and want[k]["applied"]
            off = _replayed(recipe.optimizer, want[k]["updates"], prev, now, want[k]) if replay else []
            for what, got, theirs in (("master", mine["params"], one["params"]),
                                      ("optimizer state", mine["optimizer"], flat_state(one["optimizer"]))):
                if replay:  # the first moments alone: the masters and second moments are replayed
                    got, theirs = ({n: t for n, t in d.items() if n.endswith("/exp_avg")} for d in (got, theirs))
                w, more = _against(got, theirs, one["e_t"][what], ratio, what)
                worst, off = max(worst, w), off + more
            problems += [f"rank {r}: step {k + 1}: {p}" for p in off]
            prev = now
            if one["norm"] is not None:
                got_norm, n, scale = state.get("grad_norm"), one["norm"], one["norm_scale"]
                diff = abs(got_norm - n) if got_norm is not None else math.inf
                if not diff <= ratio * scale:
                    problems.append(f"rank {r}: step {k + 1}: gradient norm {got_norm!r} vs one device {n!r} (off by "
                                    f"{diff:.3g} > {ratio:.3g} x |g - g_exact| = {scale:.3g})")
    except Exception as exc:  # noqa: BLE001 - the stack's failure is a verdict; peers inside it are ended
        return failed_here(f"rank {r}: {describe(exc)} (after {len(losses)} step(s))")
    return checked(problems, worst, ratio, losses=losses, **({"states": states} if keep else {}),
                   **({"float8_casts": casts.count, "float8_casts_seen": casts.sees} if casts else {}))


def _replayed(spec, k: int, prev: dict, now: dict, want: dict) -> list[str]:
    """``adam_replay.problems`` of step ``k`` (``prev`` -> ``now``: the stack's dense state, float64) over one device's
    parameters (``want``: the oracle's step), each tied name held to its parameter, and a master one device lacks."""
    params, names = want["params"], list(want["optimizer"])
    ties = {n: next(o for o in names if params[o] is t) for n, t in params.items() if n not in names}
    extra = [f"master {n}: not a tensor of the one-device model" for n in sorted(set(now["params"]) - set(params))]
    return adam_replay.problems(spec, k, prev, now, names, ties, want.get("lr")) + extra


def dense64(state: dict) -> dict:
    """{"params": ..., "optimizer": ...} (tensors by name) as float64 on the CPU."""
    return {part: {n: t.detach().cpu().double() for n, t in tensors.items()} for part, tensors in state.items()}


def _one_device(want: dict, own: dict, own_ratio: float) -> dict:
    """The stack's own one-device step (its dense state ``own``) in the place of the contract's (``want``). The
    norm's scale: |g_own - g_exact| <= |g_own - g| + |g - g_exact|, the first within ``own_ratio`` x the second
    (what holding ``own`` to the contract's recipe asserts of its masters, taken for its gradients). E_T: the own
    run's distance from exact arithmetic (one realization: the stack's)."""
    params, optimizer = own.get("params", {}), own.get("optimizer", {})
    return {"params": params, "optimizer": optimizer, "norm": own.get("grad_norm"),
            "norm_scale": (1 + own_ratio) * want["norm_scale"], "e_t": _scales(params, optimizer, want)}
