"""Rank side of the third-party watch tests: what torch's ``context_parallel`` does on this machine."""

from __future__ import annotations


def torch_context_parallel_probe(backend: str) -> tuple[str, str]:
    """torch's ``context_parallel`` (monkey-patched SDPA) on a causal (1, 2, 8, 4) float64 attention over
    the World, with the SDPA backend ``backend`` (FLASH_ATTENTION, MATH, EFFICIENT_ATTENTION): ("ran", "")
    or (exception type, its first line)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from harness.runtime.rank import rank_device

    mesh = init_device_mesh(rank_device().type, (dist.get_world_size(),))
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, dtype=torch.float64, device=rank_device()) for _ in range(3))
    try:
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]), \
                sdpa_kernel(getattr(SDPBackend, backend)):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return "ran", ""
    except Exception as exc:  # noqa: BLE001 - what it raises is the observation
        return type(exc).__name__, str(exc).splitlines()[0][:200]
