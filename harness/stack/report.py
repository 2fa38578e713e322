"""The report section of ``bench stack``: per family, every layout and stack — step time, tokens/s, model
state and bytes per step of the busiest rank, each beside the planner's — then the stacks side by side, and
what a stack does not provide."""

from __future__ import annotations

from harness.records.tables import not_provided


def stack_section(rows, run_dir, md) -> list[str]:
    ok = rows[rows["status"] == "ok"].copy()
    out = ["## Stacks: every layout, through the stack contract", "",
           "Each stack trains the same one-device model (`reference.models`, loaded with `load_dense`) on the "
           f"same global batch ({ok['detail'].iloc[0] if len(ok) else ''}). Ranks oversubscribe the CPU cores: the "
           "step times rank layouts and stacks against each other, not against a machine. State: the largest "
           "rank's parameters, gradients and optimizer state, measured from its live tensors; predicted: "
           "`training_memory` (float32; SGD momentum's one state, Adam's two; an even split). A family "
           "`<family>-adam-zero<stage>`: the main job's Adam sweep of the third-party stacks beside ours, at the ZeRO "
           "stage each shards with. Bytes: the busiest rank's in one step, "
           "counted (collectives, functional collectives, point-to-point sends); predicted: the planner's DP, TP and "
           "PP terms (no embedding, cross-entropy, loss or norm traffic). Bubble: measured from the pipeline's "
           "action times where the stack reports them (ours); predicted: the 1F1B bubble.", ""]
    if not len(ok):
        out += ["_(no successful rows)_", ""]
    else:
        ok["family"] = ok["op"].str.split("/").str[0]
        ok["layout"] = ok["op"].str.split("/").str[1]
        ok["step_ms"] = ok["time_p50_us"] / 1e3
        ok["state_measured"] = ok["mem_params_bytes"] + ok["mem_grads_bytes"] + ok["mem_optimizer_bytes"]
        ok["state_predicted"] = ok["mem_params_predicted"] + ok["mem_grads_predicted"] + ok["mem_optimizer_predicted"]
        cols = ["layout", "impl", "step_ms", "tokens_per_s", "state_measured", "state_predicted",
                "comm_bytes_measured", "comm_bytes_predicted", "bubble_measured", "bubble_predicted"]
        for family, rows_f in ok.groupby("family", sort=False):
            out += [f"### {family}", "", md(rows_f.sort_values(["layout", "impl"])[cols], ".4g", index=False), ""]
        out += _side_by_side(ok, md)
    missing = not_provided(rows, md, ["impl", "op", "detail"])
    return out + (["### Not provided", "", *missing] if missing else [])


def beside_ours(ok):
    """Each stack's step time, bytes and (where measured) model state relative to ours on the same layout,
    one row per (op, impl) where both ran; None where there is nothing to compare. ``ok``: the stack rows
    with status ok."""
    if ok["impl"].nunique() < 2 or "reference" not in set(ok["impl"]):
        return None
    ours = ok[ok["impl"] == "reference"].set_index("op")
    table = []
    for _, r in ok[ok["impl"] != "reference"].iterrows():
        if r["op"] in ours.index:
            base = ours.loc[r["op"]]
            row = {"op": r["op"], "impl": r["impl"], "step_vs_ours": r["time_p50_us"] / base["time_p50_us"],
                   "bytes_vs_ours": r["comm_bytes_measured"] / base["comm_bytes_measured"]
                   if base["comm_bytes_measured"] else None}
            if "state_measured" in ok:
                row["state_vs_ours"] = r["state_measured"] / base["state_measured"]
            table.append(row)
    if not table:
        return None
    import pandas as pd

    return pd.DataFrame(table)


def _side_by_side(ok, md) -> list[str]:
    """Each stack's step time and bytes relative to ours on the same layout (where both ran)."""
    frame = beside_ours(ok)
    if frame is None:
        return []
    return ["### Beside ours", "",
            "Ratios to the reference stack on the same layout (> 1: slower, more bytes, more state). Medians: "
            + ", ".join(f"{impl} {g['step_vs_ours'].median():.2f}x the step time, "
                        f"{g['bytes_vs_ours'].median():.2f}x the bytes" for impl, g in frame.groupby("impl")) + ".", "",
            md(frame, ".3g", index=False), ""]


def headlines(bench, link) -> list[str]:
    """The summary's line: the medians the stacks section's "Beside ours" states."""
    frame = beside_ours(bench[(bench["suite"] == "stack") & (bench["status"] == "ok")])
    if frame is None:
        return []
    parts = [f"{impl} {g['step_vs_ours'].median():.2f}x our step time, {g['bytes_vs_ours'].median():.2f}x our "
             f"bytes ({len(g)} layouts)" for impl, g in frame.groupby("impl")]
    return [f"- **Stacks beside ours** ({link('medians', 'Beside ours')}): {'; '.join(parts)}."]


MARKS = {"pass": "pass", "fail": "FAIL", "known-nonconformance": "finding", "unsupported": "unsupported",
         "refused": "refused"}


def stack_matrix_section(conf, run_dir, md) -> list[str]:
    """The per-stack conformance matrix of a test run (``pytest suites/stack --results-dir``): one row per
    check and case (the test; family / layout / ZeRO / schedule), one column per stack (planted bugs left out),
    each cell the
    verdict — pass, FAIL, finding (a known non-conformance of the findings registry), unsupported or refused
    — and below it every non-pass cell's reason, the table a design review takes."""
    rows = conf[(conf["suite"] == "stack") & ~conf["impl"].astype(str).str.startswith("suites.")].copy()  # not planted
    if not len(rows):
        return []
    rows["case"] = rows["collective"].fillna("") + rows["dtype"].map(lambda d: "" if d == "float64" else f" ({d})")
    # a run over several releases of a stack (the release matrix): one column per stack and release
    import pandas as pd

    release = (rows["release"].astype(object).fillna("").astype(str) if "release" in rows
               else pd.Series("", index=rows.index))
    several = release.groupby(rows["impl"]).transform("nunique") > 1
    rows["impl"] = rows["impl"].astype(str).where(~several, rows["impl"].astype(str) + " " + release)
    # the check a row comes from (the test, its parameters dropped): a refusal test's case is not an equivalence's
    rows["check"] = rows["property"].fillna("").astype(str).str.split("[").str[0].str.removeprefix("test_")
    cell = rows.groupby(["check", "case", "impl"])["outcome"].agg(
        lambda o: MARKS.get(next((x for x in ("fail", "known-nonconformance", "refused", "unsupported")
                                  if x in set(o)), "pass"), "pass")).unstack(fill_value="")
    out = ["## Stacks held to one device: the conformance matrix", "",
           "Every case run (the stack suite's, `suites/stack`; the main job's: the fixed matrix of "
           "`harness/stack/matrix.py`, check `matrix`), per stack: the check (the test) and the family / "
           "layout (dp x pp x tp, -cp, -ep) / ZeRO stage / schedule. finding: a known non-conformance "
           "(`harness/records/findings.py`, with its watch test); unsupported / refused: the stack's own sentence, "
           "below.", "",
           md(cell.reset_index(), "g", index=False), ""]
    why = rows[rows["outcome"].isin(["fail", "known-nonconformance", "unsupported", "refused"])]
    if len(why):
        reasons = why.groupby(["impl", "outcome", "detail"]).size().reset_index(name="cases")
        out += [md(reasons[["impl", "outcome", "cases", "detail"]], "g", index=False), ""]
    return out
