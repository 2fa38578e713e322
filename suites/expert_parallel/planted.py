"""Planted bugs behind the expert-parallel contract, loaded by spec like a user's implementation."""

from __future__ import annotations

from reference.expert_parallel import ReferenceExpertParallel


def _planted(**bug):
    class Planted(ReferenceExpertParallel):
        def __init__(self):
            super().__init__(**bug)
    return Planted


RouterNotReduced = _planted(router_not_reduced=True)
"""The router's gradient left as each rank's own tokens' share."""
ExpertsDividedByEDP = _planted(experts_divided_by_edp=True)
"""Expert gradients divided by the expert-data-parallel size instead of the data-parallel size (x ep)."""
ExpertsOverWholeGroup = _planted(experts_over_whole_group=True)
"""Local experts' gradients all-reduced over the whole group, slot by slot (other experts added in)."""
CombineWithDispatchedIndices = _planted(combine_dispatched=True)
"""The combine writes each expert output at its dispatched position, not its token."""
AuxOverLocalTokens = _planted(aux_local=True)
"""The load-balancing loss over this rank's tokens only."""
NotRenormalized = _planted(not_renormalized=True)
"""The top-k weights not renormalised where the layer says so."""
SharedOnDispatched = _planted(shared_on_dispatched=True)
"""The shared expert applied to the dispatched rows instead of the rank's own tokens."""
BiasIgnored = _planted(bias_ignored=True)
"""Sigmoid routing that drops the selection bias (DeepSeek-V3's auxiliary-loss-free balancing): the top-k of the
bare scores."""
CapacityIgnored = _planted(capacity_ignored=True)
"""A capacity factor never applied: every assignment dispatched (dropless) where the layer drops some."""
