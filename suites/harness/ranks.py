"""Rank-side functions for the World tests (module-level, so a World can call them)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def rank_and_sum() -> tuple[int, int, float]:
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), t.item()


def raise_on(rank: int) -> None:
    if dist.get_rank() == rank:
        raise ValueError(f"planted failure on rank {rank}")
    dist.barrier()  # the others wait in a collective the failing rank never joins


def raise_with_collective_in_flight(rank: int) -> None:
    """The others start an all-reduce of 4 floats and return without waiting for it (as DTensor's
    asynchronous functional collectives do); ``rank`` raises."""
    if dist.get_rank() == rank:
        raise ValueError(f"planted failure on rank {rank}")
    dist.all_reduce(torch.ones(4), async_op=True)


def hang_on(rank: int) -> None:
    if dist.get_rank() == rank:
        time.sleep(3600)
    dist.barrier()


def exit_on(rank: int, code: int) -> None:
    if dist.get_rank() == rank:
        os._exit(code)
    dist.barrier()


def pid() -> int:
    return os.getpid()


def threads() -> tuple[int, str]:
    return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS", "")


def unpicklable_result():
    return lambda: None


def verdict_on(rank: int, peers_join: bool = False) -> dict:
    """``rank`` catches the code under test's failure (its verdict) and returns; the others block in a
    barrier it never joins — unless ``peers_join``: then it joins late and everyone returns."""
    from harness.rank import failed_in_implementation

    if dist.get_rank() == rank:
        detail = failed_in_implementation(f"rank {rank}: raised ValueError: odd length 1")
        if peers_join:
            dist.barrier()
        return {"problems": [detail]}
    dist.barrier()
    return {"problems": []}
