"""Expert parallelism: the experts of an MoE layer (``reference.models.moe.MoE``) split over an EP group,
tokens sent to their experts' ranks and back.

Layout over a group of n ranks with ``ep`` dividing n: EP groups of ``ep`` consecutive ranks (rank r is EP
rank r mod ep of EP group r // ep); EP rank j holds experts [j E / ep, (j + 1) E / ep) (E % ep != 0 is
refused in one sentence). The **expert-data-parallel group** of a rank: the n / ep ranks with its EP rank
— the replicas of its experts, one per EP group. The router and the shared experts are replicated on
every rank.

Forward, per rank (``ExpertParallelMoE``): route its own tokens; count its (token, slot) assignments per
destination EP rank, exchange the counts (an all-to-all of ep integers), then the tokens themselves and
their expert ids (all-to-alls with those variable splits — a rank may send or receive nothing); run each
local expert on the rows it received; send the outputs back by the inverse all-to-all; combine each
output into its own token, weighted by its routing weight; add the shared experts on its own tokens.

Gradients, derived. Training averages the loss over the n data-parallel ranks (each rank's loss the mean
over its own tokens): one device's gradient of a replicated parameter is (1 / n) sum_r g_r, the usual DP
average. An expert e lives on one rank of each EP group; the dispatch's backward already collects on that
rank the contributions of every token its EP group routed to e — sum over the ep ranks r of that group of
g_r(e). So one device's gradient is (1 / n) x the **sum over e's expert-data-parallel group** (the n / ep
replicas, one per EP group) of those collected gradients. Two ways to get it wrong, both silent: dividing
that sum by the expert-data-parallel size n / ep instead of n — ep times too large, pytorch #160285's
2x at ep = 2 —, and reducing the local experts over the whole group instead of the expert-data-parallel
one — which adds, slot by slot, other experts' gradients into each. The router and the shared experts are
replicated everywhere: summed over the whole group, as any dense parameter. ``full_grads`` returns the
sums (the loss a sum over the group's tokens: no 1 / n).

Bytes per rank per layer (T_s assignments this rank sends, T_r it receives, h hidden, e bytes; its own EP
rank's share is not sent): dispatch (T_s − own) h e forward and (T_r − own) h e backward (the outputs'
gradients come back the same way), combine the reverse; plus 8 (ep − 1) bytes of counts and the expert ids.
"""

from __future__ import annotations

from .moe import ExpertParallelMoE, ReferenceExpertParallel, full_grads

__all__ = ["ExpertParallelMoE", "ReferenceExpertParallel", "full_grads"]
