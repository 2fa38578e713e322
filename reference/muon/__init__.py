"""Muon held to one device under sharding: the update orthogonalises each weight matrix's momentum (Newton-Schulz), so
a sharded trainer must orthogonalise the **full logical matrix** — every part of a fused one (QKV, gate + up) apart —
never a rank's rows of it.

``newton_schulz`` is torch's iteration (``torch.optim.Muon``: quintic coefficients, 5 steps, in bfloat16) with the
dtype a parameter; ``MuonSpec`` says the hyper-parameters and which parameters Muon takes (the rest: AdamW);
``one_device`` is the oracle; ``ShardedMuon`` the reference sharded optimizer (each rank gathers the matrices it holds
a part of, orthogonalises the whole, keeps its part) over the layouts of ``LAYOUTS``; ``MuonAdamW`` the optimizer the
stacks train with (``OptimizerSpec("muon", ...).build_named``)."""

from .newton_schulz import newton_schulz
from .optimizer import MuonAdamW
from .sharded import LAYOUTS, ReferenceMuon, ShardedMuon, local_part
from .spec import MuonSpec, one_device

__all__ = ["LAYOUTS", "MuonAdamW", "MuonSpec", "ReferenceMuon", "ShardedMuon", "local_part", "newton_schulz",
           "one_device"]
