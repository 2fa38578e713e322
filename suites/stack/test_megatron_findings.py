"""Watches of megatron-core's findings outside its training step (harness/stack/findings.py): what it still needs of
CUDA without the adapter's redirect, and what its checkpoint writer needs that it does not declare."""

from __future__ import annotations

import pytest

from harness.records import findings, registry
from harness.runtime.capabilities import says_no_cuda

MEGATRON = registry.skip_reason(registry.resolve("megatron", "stack"))
pytestmark = pytest.mark.skipif(bool(MEGATRON), reason=f"megatron-core: {MEGATRON}")


def _rope_outside_the_redirect() -> str:
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    try:  # 0.15 already at construction, 0.16 on first use
        rope = RotaryEmbedding(kv_channels=4, rotary_percent=1.0, use_cpu_initialization=True)  # as the stack builds it
        rope.get_emb(4) if hasattr(rope, "get_emb") else rope(4)  # 0.15: its forward (get_emb came in 0.16)
        return "ran"
    except Exception as exc:  # noqa: BLE001 - what it raises is the observation (the watch reads its words)
        return f"{type(exc).__name__}: {exc}"


def test_watch_megatron_core_still_needs_cuda_without_the_redirect(world_cache):
    """Watch: outside ``megatron_cpu.on_cpu()`` megatron-core's rotary embedding moves its ``inv_freq`` to
    ``torch.cuda.current_device()`` on first use. Fails once megatron-core runs on a CPU as it is (then the redirect
    can go). On a rank (megatron-core imported there already), not in pytest's process."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: megatron-core runs as it is")
    got = world_cache.get(1).run(_rope_outside_the_redirect, timeout=120)[0]
    assert says_no_cuda(got), got


def _writer_without_psutil() -> str:
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    held = filesystem_async.HAVE_PSUTIL
    filesystem_async.HAVE_PSUTIL = False  # what a machine without psutil imports
    try:
        filesystem_async._process_memory()
        return "measured"
    except RuntimeError as exc:
        return str(exc)
    finally:
        filesystem_async.HAVE_PSUTIL = held


def test_watch_megatron_checkpoint_writer_needs_psutil_it_does_not_declare(world_cache):
    """Watch: megatron-core's writer processes call ``_process_memory``, which raises without psutil (the save then
    waits for them forever), and megatron-core's requirements do not name psutil. Fails once either changes (then
    the adapter's refusal goes)."""
    from importlib import metadata

    why = findings.outside_range("suites/stack/test_megatron_findings.py::"
                                 "test_watch_megatron_checkpoint_writer_needs_psutil_it_does_not_declare")
    if why:
        pytest.skip(why)
    requires = [r.split(";")[0].strip().lower() for r in metadata.requires("megatron-core") or []
                if "extra ==" not in r]
    assert not any(r.startswith("psutil") for r in requires), requires
    assert "psutil is not installed" in world_cache.get(1).run(_writer_without_psutil, timeout=120)[0]


def _muon_built() -> str:
    """Rank side: megatron-core's TensorParallelMuon over one 8 x 4 parameter, one step: "stepped", or what it raised
    (its words: the watch reads them)."""
    import torch
    from megatron.core.optimizer.muon import TensorParallelMuon

    p = torch.nn.Parameter(torch.randn(8, 4))
    p.grad = torch.randn(8, 4)
    try:
        TensorParallelMuon([p], lr=0.02).step()
        return "stepped"
    except TypeError as exc:
        return f"TypeError: {exc}"


def test_watch_megatron_muon_does_not_construct_with_emerging_optimizers(world_cache):
    """Watch: megatron-core 0.16.1's TensorParallelMuon against emerging-optimizers 0.3.0 raises a TypeError (its
    keyword names are another release's). Skips where emerging-optimizers is not importable (it needs Python
    >= 3.12). Fails once megatron-core's Muon steps with what PyPI serves."""
    import importlib.util

    if not importlib.util.find_spec("emerging_optimizers"):
        pytest.skip("emerging-optimizers is not installed (its one release, 0.3.0, needs Python >= 3.12)")
    why = findings.outside_range("suites/stack/test_megatron_findings.py::"
                                 "test_watch_megatron_muon_does_not_construct_with_emerging_optimizers")
    if why:
        pytest.skip(why)
    got = world_cache.get(1).run(_muon_built, timeout=120)[0]
    assert "OrthogonalizedOptimizer.__init__() missing" in got and "'nesterov'" in got, got
