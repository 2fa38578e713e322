"""The false-alarm / power study's analysis, on synthetic run folders (the study itself is a script:
``python -m harness.gate.study``; its figures are measured, never asserted)."""

from __future__ import annotations

from harness.gate.study import analyze

from .runs import bench_row, write_run


def test_analyze_counts_false_alarms_and_detections(tmp_path):
    def runs(kind: str, factor: float, count: int, spec: str, seed: int) -> None:
        for i in range(count):
            rows = [bench_row(impl=f"harness.gate.planted:{spec}", nbytes=b, median_us=1000.0 * factor)
                    for b in (1 << 20, 4 << 20)]
            write_run(tmp_path / kind, rows, seed=seed + i)

    runs("same", 1.0, 4, "slowed_0", 0)
    runs("slow50", 3.0, 2, "slowed_50", 100)
    text = analyze(tmp_path, 0.10, 0.99)
    assert "4 unchanged runs" in text
    assert "0/12 ordered pairs flag anything" in text  # the same distribution: nothing beyond 10 %
    assert "vs the held-out run: 0/4 runs flag anything" in text
    # 3x slower: every case of every slowed run is flagged against every single run and the merged baseline
    assert "single-run baseline 16/16 (100%); baseline merged from 4 runs 4/4 (100%)" in text
