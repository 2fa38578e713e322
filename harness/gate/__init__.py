"""The regression gate: ``paritybench compare BASELINE NEW`` and ``paritybench baseline RUN ... --out DIR``.

Reads run folders only (``harness.records.results.read_run``). Conformance and deterministic figures compare
exactly; times compare every timed iteration (samples.csv) with a significance test AND an effect-size
threshold (``stats.ratio_interval``). Exit 0: no regression; 1: regressions, each named in one line;
2: bad input, one sentence.
"""
