"""``paritybench schedule``: the text grid and metrics, a Gantt PNG, and bad input exit 2."""

from __future__ import annotations

import pytest

from harness.cli.main import main


def test_1f1b_grid_and_metrics(capsys):
    assert main(["schedule", "1f1b", "--p", "4", "--m", "8"]) == 0
    out = capsys.readouterr().out
    assert "rank 3: " in out and "3F0" in out
    assert "makespan 33, bubble 0.2727" in out  # (m + p - 1)(F + B) = 11 * 3; (p-1)/(m+p-1) = 3/11


def test_png(tmp_path, capsys):
    png = tmp_path / "zb.png"
    assert main(["schedule", "zb-h1", "--p", "3", "--m", "4", "--png", str(png), "--lowered"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "SEND_F" in capsys.readouterr().out


def test_dualpipev_prints_its_pairs_and_deepseeks_bubble(capsys):
    """DualPipeV at p = 2, m = 4 with an overlap gain (F&B = 2.5 < F + B): its overlapped pairs listed; rank 0 idles
    (p - 1)(F&B + B - 3W) = 1.5 inside its span, DualPipe's table; 2p + 1 = 5 stage activations per rank."""
    assert main(["schedule", "dualpipev", "--p", "2", "--m", "4", "--costs", "F=1,B=2,I=1,W=1,F&B=2.5"]) == 0
    out = capsys.readouterr().out
    assert "overlapped (F&B, one unit): 0F3&3B1 " in out
    assert "idle within each rank's span [1.5, 0.5], peak stage activations per rank [5, 5]" in out


@pytest.mark.parametrize("argv, needle", [
    (["schedule", "interleaved", "--p", "4", "--m", "9"], "whole rounds: m=9"),
    (["schedule", "1f1b", "--p", "0", "--m", "6"], "p must be a whole number >= 1"),
    (["schedule", "1f1b", "--p", "2", "--m", "2", "--costs", "F=fast"], "--costs 'F=fast' must look like"),
    (["schedule", "1f1b", "--p", "2", "--m", "2", "--costs", "X=1"], "--costs takes non-negative"),
    (["schedule", "pipedream", "--p", "2", "--m", "2"], "invalid choice: 'pipedream'"),
])
def test_bad_input_exit_2(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
