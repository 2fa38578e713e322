"""One stack case's verdict, the same in the suite and in the main job's matrix: a stack's case trained on a
World (``case.train_stack`` on every rank), its ranks' results reduced to pass / fail / unsupported / refused, a
failure a registry finding explains turned into ``known-nonconformance`` — and its conformance row."""

from __future__ import annotations


def release_of(impl: str) -> str:
    """The installed release of the distribution a built-in stack (or an option of one) runs; '' for ours and for a
    user's (a conformance row's ``release``)."""
    from harness.records.findings import _builtin
    from harness.records.releases import STACKS
    from harness.records.versions import installed

    dist = STACKS.get(_builtin(impl, "stack") or "")
    return (installed(dist) or "") if dist else ""


def localising(asked: bool | None) -> bool:
    """Whether a failing case is localised: ``asked``, else the environment's ``PARITYBENCH_LOCALISE`` (default on;
    "0" off — the mutation table's runs, which only count fails)."""
    import os

    return asked if asked is not None else os.environ.get("PARITYBENCH_LOCALISE", "1") != "0"


def hold(world_cache, conformance, impl: str, n: int, spec, layout, recipe, localise: bool | None = None,
         **kw) -> dict:
    """``judged`` on the session's World of ``n`` ranks, recorded as a conformance row (``conformance``: the
    pytest plugin's fixture) — what the ``stack_case`` fixture and the stack suite's tests call. A fail is
    localised (``harness.localise``; ``localise``: see ``localising``): its lines lead the problems, its row's
    detail is its first line, its JSON and plot are in the run folder; v["localised"] holds it."""
    v = judged(world_cache.get(n), impl, spec, layout, recipe, one=lambda: world_cache.get(1), **kw)
    # a float8 recipe's tensors, and Muon's bfloat16 iteration's, have no per-op bound to localise against
    if v["outcome"] == "fail" and set(kw) <= {"steps", "padded"} and recipe.low_precision is None \
            and recipe.optimizer.name != "muon" and localising(localise):
        from harness.localise import Case
        from harness.localise import localise as localise_case

        case = Case(spec, layout, recipe, kw.get("steps", 2), kw.get("padded", False))
        try:
            loc = localise_case(world_cache.get, impl, case, judged, v["problems"])
        except Exception as exc:  # noqa: BLE001 - the verdict stands without its localisation; said, never a crash
            from harness.errors import describe

            v["problems"] = [f"(not localised: {describe(exc)})"] + v["problems"]
        else:
            v["localised"], v["problems"] = loc, loc.lines() + v["problems"]
            v["row"] = {**v["row"], "detail": loc.lines()[0] + " | " + v["row"]["detail"]}
            run = getattr(conformance, "run", None)
            if run is not None:
                from harness.localise.saved import save

                save(loc, run.path, f"{conformance.property}-{impl}-{v['row']['collective']}")
    conformance.record(v["outcome"], finding=v["known"], **{**v["row"], "world_size": n})
    return v


def judged(world, impl: str, spec, layout, recipe, one=None, **kw) -> dict:
    """{"outcome", "problems", "refused", "per_rank", "known", "row"} of ``impl`` on ``layout`` (``world``: a World
    of ``layout.world_size`` ranks). Whatever the stack does — raise, hang, die — is a verdict, not an error.
    ``one``: a callable giving a World of 1, for a stack whose low-precision recipe is its own
    (``harness.stack.own_recipe``); without it such a stack is held to the contract's recipe directly."""
    from harness.records import findings
    from harness.runtime.world import run_or_fail

    from ..verdict import reduce, worst
    from . import case as ranks
    from .own_recipe import held, own_recipe

    if one is not None and own_recipe(impl, spec) and set(kw) <= {"padded"}:
        per_rank = held(world, one, impl, spec, layout, recipe, padded=kw.get("padded", False))
    else:
        per_rank = run_or_fail(world, ranks.train_stack, impl, spec, layout, recipe, timeout=300, failed=ranks.failed,
                               **kw)
    outcome, refused, problems = reduce(per_rank)
    if outcome == "pass" and recipe.low_precision is not None:  # within the bound, but did it compute in float8?
        from .casts import check

        short = check(per_rank, spec, layout, recipe, kw.get("steps", 2))
        outcome, problems = ("fail", [short]) if short else (outcome, problems)
    # equal, but did it recompute as told? (selective: its silent failure; "full": suites/stack/test_recompute.py)
    if outcome == "pass" and layout.checkpoint_policy == "selective":
        from .recompute import check as recomputed

        off = recomputed(world, impl, spec, layout, recipe)
        if isinstance(off, str):
            problems = [f"(recompute not counted: {off})"]
        elif off:
            outcome, problems = "fail", off
    known = findings.match(impl, "stack", problems, norm_type=recipe.norm_type, tp=layout.tp, dp=layout.dp,
                           pp=layout.pp, tie_embeddings=spec.tie_embeddings, zero=layout.zero, ep=layout.ep,
                           cp=layout.cp, sequence_parallel=layout.sequence_parallel, family=spec.family,
                           vocab_remainder=spec.vocab % layout.tp, checkpointing=layout.checkpointing,
                           accumulation=recipe.accumulation, option=impl, low_precision=recipe.low_precision,
                           compile=layout.compile, optimizer=recipe.optimizer.name,
                           clipped=recipe.max_grad_norm is not None, dtype=spec.dtype, schedule=layout.schedule,
                           microbatches=layout.num_microbatches, layout=layout) if outcome == "fail" else None
    outcome = "known-nonconformance" if known else outcome
    row = {"suite": "stack", "world_size": layout.world_size, "dtype": spec.dtype, "impl": impl,
           "release": release_of(impl),
           "collective": f"{spec.family}/{layout.label()}/zero{layout.zero}/{layout.schedule}"
           + ("/padded" if kw.get("padded") else ""),
           "max_rel_err": worst(per_rank), "detail": refused or " | ".join(problems[:1])}
    return {"outcome": outcome, "problems": problems, "refused": refused, "per_rank": per_rank, "known": known,
            "row": row}
