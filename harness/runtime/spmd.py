"""The torchrun entry point: ``torchrun ... -m harness.runtime.spmd (pytest|paritybench) ARGS...``.

    torchrun --nnodes 2 --nproc-per-node 8 ... -m harness.runtime.spmd pytest suites/collectives --world-sizes 16
    torchrun --nproc-per-node 4 -m harness.runtime.spmd paritybench bench collectives --world-sizes 4

Every process initialises the runtime (``harness.runtime.spmd_runtime``); rank 0 runs the command, the others
follow its World's calls until it is done.
"""

from __future__ import annotations

import sys

from harness.runtime import spmd_runtime as runtime


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("pytest", "paritybench"):
        print("harness.runtime.spmd: usage: torchrun ... -m harness.runtime.spmd (pytest|paritybench) [ARGS...]",
              file=sys.stderr)
        return 2
    if not runtime.under_torchrun():
        print("harness.runtime.spmd: not under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR unset).",
              file=sys.stderr)
        return 2
    import torch.distributed as dist

    runtime.init()
    code = 0
    if runtime._STATE["rank"] != 0:
        runtime.follow()
    else:
        try:
            if argv[0] == "pytest":
                import pytest

                code = int(pytest.main(argv[1:]))
            else:
                from harness.cli.main import main as cli_main

                code = cli_main(argv[1:])
        finally:
            dist.broadcast_object_list([None], src=0, group=runtime._STATE["control"])
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
