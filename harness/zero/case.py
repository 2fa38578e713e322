"""The data-parallel / ZeRO conformance case (inputs, oracle, check; rank side): one implementation trained on
this rank's slice of a global batch, against one device trained on the whole batch (computed on every rank,
same seed)."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

from harness.errors import describe
from harness.verdict import checked, failed_here, refusal, refused_by
from harness.verdict import failed as verdict_failed
from reference.models import TransformerBlock, mlp
from reference.zero import OptimizerSpec, StepRecipe

LR = {"sgd": 0.05, "adam": 0.01, "adamw": 0.01}
ADAM_EPS = 1e-3  # bounds Adam's sensitivity to gradient rounding (see bound())
ADAMW = {"weight_decay": 0.1, "decay": "matrices"}
"""AdamW as users set it: torch's usual decay, the biases and norms spared (Megatron's / the HF Trainer's rule) — in
float64 a 0.1 % decay of the wrong parameters is 1e9 times the bound."""


def spec_for(opt_name: str) -> OptimizerSpec:
    return OptimizerSpec(opt_name, LR[opt_name], eps=ADAM_EPS, **(ADAMW if opt_name == "adamw" else {}))


def bound(step: int, batch: int, n: int, dtype: str, spec: OptimizerSpec, grad_scale: float) -> float:
    """Largest allowed difference from one device, relative to each tensor's largest magnitude.

    The two computations differ only in how the gradient's sum over samples is grouped (each rank's
    mean over its slice, then the mean over ranks, vs one mean over the batch): per element within
    (B + n) u of the magnitudes summed, u the unit roundoff; the backward's chained ops (depth <= 16 for
    the block) add their own rounding: (B + n + 16) u. Momentum sums past gradients (factor
    1/(1 - 0.9) = 10, rounded up to 16); each step adds its own difference: x step. Adam divides by
    sqrt(v) + eps: a gradient error d moves the update by at most lr d / eps, i.e. relative to a
    gradient of scale G, (1 + lr G / eps) times. ZeRO's shards step elementwise and add nothing.
    A missing average (x n) or a shifted shard boundary is off by O(1): 10^6 times this and more."""
    u = torch.finfo(getattr(torch, dtype)).eps / 2
    amplification = 1 + (spec.lr * grad_scale / spec.eps if spec.adam else 0)
    return step * (batch + n + 16) * u * 16 * amplification


def build_model(name: str, seed: int, dtype: str) -> torch.nn.Module:
    torch.manual_seed(seed)
    dt = getattr(torch, dtype)
    return mlp(dtype=dt) if name == "mlp" else TransformerBlock(dtype=dt)


def global_batch(name: str, batch: int, seed: int, dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1)
    dt = getattr(torch, dtype)
    shape_in, shape_out = ((batch, 4), (batch, 3)) if name == "mlp" else ((batch, 3, 8), (batch, 3, 8))
    return torch.randn(shape_in, generator=g, dtype=dt), torch.randn(shape_out, generator=g, dtype=dt)


def mask_rows(y: torch.Tensor, n: int, per_rank: int) -> torch.Tensor:
    """The masked recipe's padded batch: ``y`` with each rank's slice right-padded (rows of ``IGNORED``) to
    per_rank - 1 counted rows on rank 0 down to none on the last — so ranks, and each rank's micro-steps, count
    differently, and the last rank's micro-steps count nothing."""
    from reference.zero.masked import IGNORED

    y = y.clone()
    for r in range(n):
        counted = per_rank - 1 - (round(r * (per_rank - 1) / (n - 1)) if n > 1 else 0)
        y[r * per_rank + counted:(r + 1) * per_rank] = IGNORED
    return y


def _single_device(model, spec, x, y, steps: int, recipe: StepRecipe | None = None) -> list[dict]:
    """One device, whole batch, one backward (accumulation is what the parallel side does): after each
    step the loss, params, grads, optimizer state and, with clipping, the gradient norm before clipping.
    The masked recipe: the mean over the counted rows (``reference.zero.masked``)."""
    from reference.zero.masked import mean_squared_error

    opt = spec.build(model.parameters())
    out = []
    masked = recipe is not None and recipe.masked
    for _ in range(steps):
        opt.zero_grad()
        loss = mean_squared_error(model(x), y) if masked else F.mse_loss(model(x), y)
        loss.backward()
        norm = None
        if recipe is not None and recipe.max_grad_norm is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm, recipe.norm_type))
        opt.step()
        out.append({"loss": float(loss.detach()), "norm": norm,
                    "params": {k: p.detach().clone() for k, p in model.named_parameters()},
                    "grads": {k: p.grad.clone() for k, p in model.named_parameters()},
                    "state": {k: {s: opt.state[p][s].clone() for s in spec.state_keys}
                              for k, p in model.named_parameters()}})
    return out


def train_case(impl_spec: str, stage: int, model_name: str, opt_name: str, steps: int, per_rank: int,
               seed: int, dtype: str | None = None, recipe: StepRecipe | None = None,
               replicate: int | None = None, offload: bool = False) -> dict:
    """``dtype`` None: float64 where the implementation allows it (its ``dtypes``), else its first.
    ``recipe``: gradient accumulation and clipping (passed to ``build`` as ``recipe=``; an implementation
    whose build takes no recipe is unsupported for it). With clipping, the trainer's ``last_grad_norm``,
    where it reports one (not None), is held to one device's norm, and the gradients are not compared
    (some read them before clipping, some after: the contract leaves it open). ``replicate``: hybrid sharding
    (``build(..., replicate=)``: the ranks as a replicate x shard mesh, 1 and N included; an implementation whose
    build takes no ``replicate`` is unsupported for it)."""
    from harness.records import registry

    n, r = dist.get_world_size(), dist.get_rank()
    impl = registry.load(impl_spec, "zero")
    dtype = dtype or ("float64" if "float64" in getattr(impl, "dtypes", ("float64",)) else impl.dtypes[0])
    spec = spec_for(opt_name)
    from harness.runtime.world import rank_device

    device = rank_device()  # cuda:<local rank> under nccl (tox -e gpu), else the CPU
    model = build_model(model_name, seed, dtype).to(device)
    x, y = (t.to(device) for t in global_batch(model_name, n * per_rank, seed, dtype))
    if recipe is not None and recipe.masked:
        y = mask_rows(y, n, per_rank)
    want = _single_device(copy.deepcopy(model), spec, x, y, steps, recipe)
    keywords = {**({"recipe": recipe} if recipe is not None else {}),
                **({"replicate": replicate} if replicate is not None else {}),
                **({"offload": True} if offload else {})}
    try:
        trainer = impl.build(copy.deepcopy(model), spec, stage, None, **keywords)
    except Exception as exc:  # noqa: BLE001 - whatever the code under test raises is a verdict
        taken = [k for k in keywords if isinstance(exc, TypeError) and k in str(exc)]
        if taken:
            return refusal(f"its build takes no {taken[0]} ({exc}).", unsupported=True)
        return refused_by(exc) or _raised("build", exc, model)
    mine = slice(r * per_rank, (r + 1) * per_rank)
    grad_scale = max(float(g.abs().max()) for w in want for g in w["grads"].values())
    checks, problems = [], []
    for k in range(steps):
        try:
            local = torch.tensor([float(trainer.step(x[mine], y[mine]))], dtype=torch.float64, device=device)
        except Exception as exc:  # noqa: BLE001 - peers blocked in the implementation are ended after a grace
            return _raised(f"step {k + 1}", exc, model)
        dist.all_reduce(local)
        if k in (0, steps - 1):
            try:
                check = _compare(k + 1, float(local) / n, trainer, want[k], grads=want[k]["norm"] is None)
            except Exception as exc:  # noqa: BLE001 - full_params / full_grads / full_optimizer_state raised
                return _raised(f"reading the state after step {k + 1}", exc, model)
            check["bound"] = bound(k + 1, n * per_rank, n, dtype, spec, grad_scale)
            got = getattr(trainer, "last_grad_norm", None)
            check["norms"] = (got, want[k]["norm"])
            if want[k]["norm"] is not None and got is not None:  # not reported: the parameters still tell
                check["worst"]["gradient norm"] = abs(got - want[k]["norm"]) / want[k]["norm"]
            problems += check.pop("problems") + [f"step {k + 1}: {what} off by {rel:.3g} of its magnitude > "
                                                 f"{check['bound']:.3g}" for what, rel in check["worst"].items()
                                                 if not rel <= check["bound"]]
            checks.append(check)
    try:
        memory = trainer.memory()
    except Exception as exc:  # noqa: BLE001 - the code under test's failure is a verdict
        memory, problems = {}, problems + [f"memory() raised {describe(exc)}"]
    return checked(problems, checks=checks, memory=memory, numel=sum(p.numel() for p in model.parameters()),
                   dtype=dtype)


def _raised(what: str, exc: Exception, model) -> dict:
    """The implementation raised (not ValueError / Unsupported at build time): a failure with its detail (its
    peers, maybe blocked inside the implementation, are ended after the World's grace)."""
    return failed_here(f"rank {dist.get_rank()}: {what} raised {describe(exc)}", checks=[], memory={}, dtype="",
                       numel=sum(p.numel() for p in model.parameters()))


def _compare(step: int, loss: float, trainer, want: dict, grads: bool = True) -> dict:
    """Largest difference of each quantity, relative to that tensor's own largest magnitude."""
    got = {"params": trainer.full_params(), "grads": trainer.full_grads() if grads else {},
           "state": trainer.full_optimizer_state()}
    worst = {"loss": abs(loss - want["loss"]) / max(abs(want["loss"]), 1e-300)}
    problems = []
    for what in ("params", "grads") if grads else ("params",):
        for name, w in want[what].items():
            g = got[what].get(name)
            if g is None or g.shape != w.shape:
                problems.append(f"{what} {name}: missing or shape {None if g is None else tuple(g.shape)}")
                continue
            worst[f"{what} {name}"] = float((g.double() - w.double()).abs().max() / max(float(w.abs().max()), 1e-300))
    for name, states in want["state"].items():
        for key, w in states.items():
            g = got["state"].get(name, {}).get(key)
            if g is None or g.shape != w.shape:
                problems.append(f"state {name}.{key}: missing or shape {None if g is None else tuple(g.shape)}")
                continue
            worst[f"state {name}.{key}"] = float((g.double() - w.double()).abs().max()
                                                 / max(float(w.abs().max()), 1e-300))
    return {"step": step, "worst": worst, "problems": problems}


def shards_roundtrip(stage: int, model_name: str) -> list[str]:
    """Reference ZeRO-``stage`` after one Adam step: every rank's shard ranges, gathered, are exactly the
    full flat parameters followed by zero padding (no element lost, duplicated or shifted), and the
    padding of the optimizer state stays zero (it never leaks into results)."""
    from reference.zero.adapter import ReferenceZero

    n = dist.get_world_size()
    model = build_model(model_name, 0, "float64")
    x, y = global_batch(model_name, 2 * n, 0, "float64")
    r = dist.get_rank()
    trainer = ReferenceZero().build(model, spec_for("adam"), stage)
    trainer.step(x[2 * r:2 * r + 2], y[2 * r:2 * r + 2])
    full = trainer.full_params()
    engine, state = trainer.engine, trainer.optimizer.state
    flats = ([(engine.flat, engine.master, state[engine.master])] if stage in (1, 2)
             else [(u.flat, u.shard, state[u.shard]) for u in engine.units])
    names = {id(p): name for name, p in model.named_parameters()}
    problems = []
    for flat, shard, opt_state in flats:
        if shard.numel() != flat.shard_size or flat.shard_size * n != flat.padded or flat.padded - flat.numel >= n:
            problems.append(f"shard {shard.numel()} x {n} ranks does not tile {flat.numel} (+ < {n} padding)")
        gathered = flat.gather(shard.detach())
        want = torch.cat([full[names[id(p)]].flatten() for p in flat.params])
        if not torch.equal(gathered[: flat.numel], want):
            problems.append(f"gathered shards differ from the full parameters of {[names[id(p)] for p in flat.params]}")
        for key in ("exp_avg", "exp_avg_sq"):
            if bool(flat.gather(opt_state[key])[flat.numel:].any()) or bool(gathered[flat.numel:].any()):
                problems.append(f"padding of {key} or of the parameters is not zero after a step")
    return problems


def unit_sizes(model_name: str) -> list[int]:
    """Parameter counts of the modules that own parameters (the reference ZeRO-3 units)."""
    model = build_model(model_name, 0, "float64")
    return [sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()
            if next(m.parameters(recurse=False), None) is not None]


def failed(detail: str) -> dict:
    """Every rank's result where the call failed on the World (``harness.runtime.world.run_or_fail``): ``detail``
    names the failing rank and its failure."""
    return verdict_failed(detail, checks=[], memory={}, dtype="", numel="", worst=float("nan"))


def merge(per_rank: list[dict]) -> dict:
    """One verdict from every rank's ``train_case``: each rank compared its own full view (parameters,
    gradients, optimizer state) with one device; a problem on any rank is a problem, named by rank."""
    first = per_rank[0]
    if any(r["refused"] for r in per_rank):
        refused = next(r for r in per_rank if r["refused"])
        return {**refused, "problems": []}
    # a World's verdict (run_or_fail) names its rank already and stands for every rank: once
    problems = list(dict.fromkeys(p if p.startswith("rank ") else f"rank {i}: {p}"
                                  for i, r in enumerate(per_rank) for p in r["problems"]))
    if not first["checks"]:  # rank 0 raised before its first check: take a rank that got further, if any
        first = max(per_rank, key=lambda r: len(r["checks"]))
    worst = max((v for r in per_rank for c in r["checks"] for v in c["worst"].values()), default=0.0)
    return {**first, "problems": problems, "worst": worst}
