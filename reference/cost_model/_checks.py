"""Argument checks shared by the cost model: one sentence naming the value and the valid range."""

from __future__ import annotations


def positive(name: str, value, *, allow_zero: bool = False) -> None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)  # before comparing: a str raises there
    if not number or not (value >= 0 if allow_zero else value > 0):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a number {bound}; got {value!r}.")


def whole(name: str, value, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}; got {value!r}.")


def choice(name: str, value, valid) -> None:
    if value not in valid:
        raise ValueError(f"{name} must be one of {', '.join(map(str, valid))}; got {value!r}.")
