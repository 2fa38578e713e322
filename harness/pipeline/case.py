"""One pipeline equivalence case: train a few steps pipelined and on one device, and compare.

The model (reference/pipeline/model.py) has integer weights and inputs, so the first step's loss and
every gradient are integers: pipelined and single-device must agree bit for bit. Later steps carry
SGD updates with lr = 2^-10, no longer integers; they are compared with ``step_tolerance``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from harness.records import registry
from harness.runtime.rank import failed_in_implementation
from reference.pipeline.generators import placement, stages_per_rank
from reference.pipeline.model import (
    batch,
    build_layers,
    masked_sum_squared_error,
    pad_rows,
    split_stages,
    sum_squared_error,
)

from ..errors import describe

LR, MOMENTUM = 2.0**-10, 0.5
EPS = 2.0**-53  # float64 unit roundoff


@dataclass(frozen=True)
class PipelineCase:
    impl: str
    """Pipeline implementation spec (registry name or package.module:object)."""
    schedule: str
    """A name of ``reference.pipeline.GENERATORS``."""
    p: int
    """Pipeline ranks."""
    m: int
    """Microbatches per step."""
    v: int = 1
    """Stages per rank (interleaved, interleaved-zb: any; zbv, dualpipev: 2)."""
    batch: int = 8
    """Global batch rows, split into m microbatches with tensor_split (unequal when m does not divide)."""
    hidden: int = 4
    layers_per_stage: int = 1
    extra_layers: int = 0
    """Layers beyond stages x layers_per_stage (fewer than the stages): the earlier stages take one more each, the
    layer count not a multiple of the stage count."""
    steps: int = 3
    """SGD-with-momentum steps compared."""
    seed: int = 0
    padded: bool = False
    """The batch's last rows are padding (NaN targets, ``masked_sum_squared_error``): the last microbatch
    counts nothing, the one before it part of its rows."""
    shared: str = ""
    """A weight used twice: "stage" (the last stage's last layer is its layer before, applied twice in a row: a
    parent-child path inside one stage, pytorch #180952's shape; the last stage, as torch runs stage 0's backward
    whole) or "tied" (the first and the last layer are one module, as a tied
    embedding: only where the first and the last stage share a rank, the V placement's normal case)."""

    @property
    def loss_fn(self):
        return masked_sum_squared_error if self.padded else sum_squared_error

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of the global batch, padded where the case is."""
        x, y = batch(self.batch, self.hidden, self.seed)
        last = len(torch.tensor_split(torch.arange(self.batch), self.m)[-1])
        return x, pad_rows(y, min(last + 1, self.batch - 1)) if self.padded else y

    @property
    def num_stages(self) -> int:
        return self.p * self.v

    @property
    def num_layers(self) -> int:
        return self.num_stages * self.layers_per_stage + self.extra_layers

    @property
    def placement(self) -> tuple[int, ...]:
        """placement[s]: the rank that holds stage s (the schedule's: the loop, or the V)."""
        return placement(self.schedule, self.p, self.v) if self.v == stages_per_rank(self.schedule, self.v) \
            else tuple(s % self.p for s in range(self.num_stages))

    def layers(self) -> list[torch.nn.Module]:
        """The model's layers, with the case's shared weight (the same module object twice)."""
        layers = build_layers(self.num_layers, self.hidden, self.seed)
        if self.shared == "stage":
            if self.layers_per_stage < 2:
                raise ValueError("shared='stage' needs layers_per_stage >= 2 (the last stage applies a layer twice).")
            layers[-1] = layers[-2]
        elif self.shared == "tied":
            if self.placement[0] != self.placement[-1]:
                raise ValueError(f"shared='tied' needs the first and the last stage on one rank; {self.schedule} at "
                                 f"p={self.p} places them on ranks {self.placement[0]} and {self.placement[-1]}.")
            layers[-1] = layers[0]
        elif self.shared:
            raise ValueError(f"shared must be '', 'stage' or 'tied'; got {self.shared!r}.")
        return layers

    def line(self) -> str:
        return (f"impl={self.impl} schedule={self.schedule} p={self.p} m={self.m} v={self.v} "
                f"batch={self.batch} hidden={self.hidden} layers={self.num_layers} seed={self.seed}"
                + " padded" * self.padded + (f" shared={self.shared}" if self.shared else ""))

    def as_row(self) -> dict:
        return asdict(self)


def _train(modules: list[torch.nn.Module], step_fn, steps: int) -> tuple[list, list, list]:
    params = list({id(p): p for mod in modules for p in mod.parameters()}.values())  # a shared weight once
    opt = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
    losses, first_grads = [], None
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        losses.append(step_fn())
        if step == 0:
            first_grads = [None if p.grad is None else p.grad.detach().cpu().clone() for p in params]
        opt.step()
    return losses, first_grads, [p.detach().cpu().clone() for p in params]


def single_device(case: PipelineCase) -> dict:
    """The oracle: the same layers, the whole batch, one device."""
    model = torch.nn.Sequential(*case.layers())
    x, y = case.data()
    losses, grads, params = _train([model], lambda: _backward(case.loss_fn(model(x), y)), case.steps)
    return {"losses": losses, "grads": grads, "params": params}


def _backward(loss: torch.Tensor) -> torch.Tensor:
    loss.backward()
    return loss.detach()


def run_rank(case: PipelineCase) -> dict:
    """Rank side: build this rank's stages (stage s on rank ``case.placement[s]``), train ``steps`` steps,
    return per parameter (its index in the one-device model, a shared weight once) its first-step gradient
    and final value, the losses on the last stage's rank, and the runtime's per-action events of the last
    step where the implementation records them."""
    import torch.distributed as dist

    rank = dist.get_rank()
    layers = case.layers()
    index = {id(p): k for k, p in enumerate(torch.nn.Sequential(*layers).parameters())}
    stages = split_stages(layers, case.num_stages)
    from harness.runtime.world import rank_device

    device = rank_device()
    mine = {s: stages[s].to(device) for s in range(case.num_stages) if case.placement[s] == rank}
    impl = registry.load(case.impl, "pipeline")
    try:
        trainer = impl.build(mine, case.num_stages, case.schedule, case.m, case.v, case.loss_fn,
                             case.batch, (case.hidden,))
    except NotImplementedError as exc:
        return {"unsupported": str(exc)}
    except Exception as exc:  # noqa: BLE001 - whatever the code under test raises is a verdict
        return {"failed": failed_in_implementation(f"rank {rank}: build raised {describe(exc)}")}
    x, y = (t.to(device) for t in case.data())
    first, last = 0 in mine, case.num_stages - 1 in mine
    order = sorted(mine)
    try:
        losses, grads, params = _train([mine[s] for s in order],
                                       lambda: trainer.step(x if first else None, y if last else None), case.steps)
    except Exception as exc:  # noqa: BLE001 - peers still inside the implementation are ended after a grace
        return {"failed": failed_in_implementation(f"rank {rank}: step raised {describe(exc)}")}
    ids = list({id(p): p for s in order for p in mine[s].parameters()})
    per_param = {index[i]: (g, q) for i, g, q in zip(ids, grads, params, strict=True)}
    return {"params": per_param, "losses": [loss.cpu() if torch.is_tensor(loss) else loss for loss in losses]
            if last else None,
            "events": getattr(trainer, "events", None)}


def step_tolerance(case: PipelineCase, reference: dict) -> float:
    """Bound on |pipelined - single-device| for parameters after ``steps`` SGD steps.

    Step 1 is exact (integers). After it, the two runs differ only in rounding: a weight gradient is
    a sum over the batch, done per microbatch then accumulated instead of at once (and matmul blocking
    may differ with the row count), so each element differs by at most (batch + hidden) * eps relative
    to the sum of absolute terms, which is bounded by |g| magnified by the forward/backward depth: we
    take 2 * layers * (batch + hidden) * eps * max|g|. Each later step adds that to the update, times
    lr, and momentum < 1 at most doubles it, plus one ulp of the parameter when the update is applied;
    ``steps - 1`` such steps.
    """
    gmax = max(float(g.abs().max()) for g in reference["grads"] if g is not None)
    wmax = max(float(w.abs().max()) for w in reference["params"])
    per_step = 2 * case.num_layers * (case.batch + case.hidden) * EPS * gmax
    # Plus the final rounding of w - lr * v: two nearly equal updates may round to neighbouring
    # floats, one ulp (<= 2 eps |w|) apart, once per step.
    return (case.steps - 1) * (2 * LR * per_step + 2 * EPS * wmax)


def compare(case: PipelineCase, reference: dict, per_rank: list[dict]) -> dict:
    """One verdict: step-1 loss and gradients bitwise, later losses within 2 (batch * hidden) eps of
    the loss (a sum of non-negative terms regrouped), final parameters within ``step_tolerance``."""
    # A World's failure comes back once per rank: said once.
    failed = list(dict.fromkeys(r["failed"] for r in per_rank if "failed" in r))
    if failed:
        return _verdict(failed)
    unsupported = [r["unsupported"] for r in per_rank if "unsupported" in r]
    if unsupported:
        return {"outcome": "unsupported", "detail": unsupported[0], "problems": [], "max_param_error": None}
    held = {k: d for r in per_rank for k, d in r["params"].items()}
    if sorted(held) != list(range(len(reference["params"]))):
        return _verdict([f"the ranks hold parameters {sorted(held)}, not each of the model's "
                         f"{len(reference['params'])} once"])
    grads = [held[k][0] for k in sorted(held)]
    params = [held[k][1] for k in sorted(held)]
    # Whatever the implementation returned, a verdict: a loss that is not the summed loss, a missing
    # gradient or a parameter of the wrong shape is a failure with its detail, never a harness crash.
    problems = _loss_problems(case, reference, [r["losses"] for r in per_rank])
    for i, (g, want) in enumerate(zip(grads, reference["grads"], strict=True)):
        if g is None or g.shape != want.shape or not torch.equal(g, want):
            what = ("no gradient" if g is None else f"shape {tuple(g.shape)} != {tuple(want.shape)}"
                    if g.shape != want.shape else f"max diff {float((g - want).abs().max())!r}")
            problems.append(f"step-1 gradient of parameter {i}: {what}")
            break
    tol = step_tolerance(case, reference)
    shapes = [i for i, (q, want) in enumerate(zip(params, reference["params"], strict=True)) if q.shape != want.shape]
    err = float("inf") if shapes else max(
        float((q - want).abs().max()) for q, want in zip(params, reference["params"], strict=True))
    if not err <= tol:  # NaN fails too
        problems.append(f"parameters after {case.steps} steps differ by {err:.3g} > tolerance {tol:.3g}"
                        + (f" (parameters {shapes} have the wrong shape)" if shapes else ""))
    return _verdict(problems, err)


def _verdict(problems: list[str], err: float | None = None) -> dict:
    """outcome, detail (the problems joined), problems (one line each: what a finding's symptom is read from)."""
    return {"outcome": "fail" if problems else "pass", "detail": "; ".join(problems), "problems": problems,
            "max_param_error": err}


def _loss_problems(case: PipelineCase, reference: dict, returned: list) -> list[str]:
    """Step 1's loss bitwise, later ones within 2 (batch * hidden) eps of the loss; from the one rank that
    returned losses (the last stage's)."""
    given = [r for r in returned if r is not None]
    if len(given) != 1:
        return [f"losses came back from {len(given)} ranks; the last stage's rank returns them"]
    bad = [loss for loss in given[0] if not (torch.is_tensor(loss) and loss.numel() == 1)]
    if bad:
        return [f"step returned {type(bad[0]).__name__} on the last stage's rank, not the summed loss (a scalar)"]
    losses = [loss.double().reshape(()) for loss in given[0]]
    problems = []
    if not torch.equal(losses[0], reference["losses"][0]):
        problems.append(f"step-1 loss {losses[0].item()!r} != {reference['losses'][0].item()!r}")
    for k in range(1, case.steps):
        bound = 2 * case.batch * case.hidden * EPS * float(reference["losses"][k])
        if not abs(float(losses[k] - reference["losses"][k])) <= bound:
            problems.append(f"step-{k + 1} loss {losses[k].item()!r} vs {reference['losses'][k].item()!r} "
                            f"(bound {bound:.3g})")
    return problems
