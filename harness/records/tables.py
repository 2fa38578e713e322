"""What the report's sections share: their opening (a title, what the table shows) over the run's successful rows."""

from __future__ import annotations

NO_ROWS = ["_(no successful rows)_", ""]


def opening(rows, title: str, intro: str, judged: bool = False) -> tuple:
    """(the rows whose status is ok — and ``judged``: wrong, timed rows a ``wrong`` column marks — a copy; the
    section's first lines: its title and its introduction)."""
    return rows[rows["status"].isin(["ok", "wrong"] if judged else ["ok"])].copy(), [title, "", intro, ""]


def not_provided(rows, md, columns: list[str]) -> list[str]:
    """The section's closing table: its rows an implementation does not provide (status unsupported), each with its
    own sentence (``detail``) — or nothing where there are none."""
    missing = rows[rows["status"] == "unsupported"]
    return [md(missing[columns], "g", index=False), ""] if len(missing) else []
