"""Communication: bytes each rank sends per collective and algorithm, alpha-beta time, bus-bandwidth
factors, and the per-step volume of data and tensor parallelism."""

from __future__ import annotations

from ._checks import choice, positive, whole

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")
ALGORITHMS = ("ring", "tree", "rhd", "naive")


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor (nccl-tests, doc/PERFORMANCE.md): busbw = algbw * factor.

    all_reduce 2(n - 1)/n; all_gather, reduce_scatter, all_to_all (n - 1)/n; broadcast, reduce 1.
    """
    choice("op", op, OPS)
    whole("n", n)
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def _log2_ceil(n: int) -> int:
    return (n - 1).bit_length()


def collective_bytes(op: str, n: int, size: float, algorithm: str = "ring") -> float:
    """Bytes the busiest rank sends for one collective on a buffer of ``size`` bytes (S) over n ranks.

    S is nccl-tests' S: the tensor, the gathered output (all_gather), the whole input (reduce_scatter).
    Chunks are taken as exact fractions (S divisible by n); the reference algorithms in
    ``reference.collectives`` count their own bytes and match these when it is.

    ring:  all_reduce 2(n-1)/n S; reduce_scatter, all_gather (n-1)/n S; broadcast and reduce as a
           pipelined chain: S (every rank but one sends the buffer once); all_to_all (pairwise) (n-1)/n S.
    rhd:   recursive halving/doubling (Thakur et al. 2005). n = P a power of two: all_reduce 2(P-1)/P S,
           reduce_scatter and all_gather (P-1)/P S; otherwise all_reduce adds S on the ranks that fold in
           the n - P extra ranks: 2(P-1)/P S + S.
    tree:  binomial tree; the root sends ceil(log2 n) copies: broadcast ceil(log2 n) S, reduce S (each
           non-root sends once), all_reduce = reduce + broadcast: ceil(log2 n) S at the root.
    naive: central root: all_reduce (n-1) S at the root; broadcast (n-1) S; reduce S.
    """
    choice("op", op, OPS)
    choice("algorithm", algorithm, ALGORITHMS)
    whole("n", n)
    positive("size", size, allow_zero=True)
    if n == 1:
        return 0.0
    frac = (n - 1) / n
    table = {
        "ring": {"all_reduce": 2 * frac, "reduce_scatter": frac, "all_gather": frac, "broadcast": 1,
                 "reduce": 1, "all_to_all": frac},
        "tree": {"all_reduce": _log2_ceil(n), "broadcast": _log2_ceil(n), "reduce": 1},
        "naive": {"all_reduce": n - 1, "broadcast": n - 1, "reduce": 1},
    }
    if algorithm == "rhd":
        p = 1 << (n.bit_length() - 1)
        table["rhd"] = {"all_reduce": 2 * (p - 1) / p + (1 if p != n else 0)}
        if p == n:
            table["rhd"].update(reduce_scatter=frac, all_gather=frac)
    if op not in table[algorithm]:
        valid = [a for a in ALGORITHMS if op in table.get(a, {})] if algorithm != "rhd" else ["ring"]
        raise ValueError(f"algorithm {algorithm!r} is not modelled for {op} with n={n}; use one of {', '.join(valid)}.")
    return table[algorithm][op] * size


def alpha_beta_time(op: str, n: int, size: float, alpha: float, beta: float, algorithm: str = "ring") -> float:
    """Latency-bandwidth time (seconds): steps * alpha + bytes on the critical path * beta.

    Hockney's model as used by Thakur, Rabenseifner & Gropp 2005 (reduction cost omitted); alpha in
    seconds per message, beta in seconds per byte:

        ring all_reduce         2(n-1) alpha + 2(n-1)/n S beta
        rhd all_reduce          2 log2(n) alpha + 2(n-1)/n S beta     (n a power of two)
        ring RS / AG / a2a      (n-1) alpha + (n-1)/n S beta
        tree bcast / reduce     ceil(log2 n) (alpha + S beta)
        tree all_reduce         2 ceil(log2 n) (alpha + S beta)
        naive all_reduce        2(n-1) (alpha + S beta)                (the root serialises)
        ring bcast / reduce     (n-1) alpha + S beta                   (pipelined chain, fine pieces)
    """
    positive("alpha", alpha, allow_zero=True)
    positive("beta", beta, allow_zero=True)
    volume = collective_bytes(op, n, size, algorithm)
    if n == 1:
        return 0.0
    lg = _log2_ceil(n)
    if algorithm == "ring":
        steps = 2 * (n - 1) if op == "all_reduce" else n - 1
        return steps * alpha + volume * beta
    if algorithm == "rhd":
        if n & (n - 1):
            raise ValueError(f"the alpha-beta model of rhd is for n a power of two; got n={n}.")
        return (2 * lg if op == "all_reduce" else lg) * alpha + volume * beta
    rounds = {"tree": 2 * lg if op == "all_reduce" else lg, "naive": 2 * (n - 1) if op == "all_reduce" else n - 1}
    return rounds[algorithm] * (alpha + size * beta)


def dp_step_comm_bytes(n_params: float, zero_stage: int, dp: int, grad_bytes: float = 2,
                       weight_bytes: float | None = None) -> float:
    """Bytes each data-parallel rank sends per step for gradient sync (and ZeRO's parameter gathers).

    Rajbhandari et al. 2020, section 7: DP and ZeRO-1/2 move 2 Psi per step (a ring all-reduce, or
    reduce-scatter + all-gather, of Psi elements: 2(N_d - 1)/N_d Psi each); ZeRO-3 adds one more
    all-gather of the parameters (forward and backward gathers, reduce-scattered gradients): 3 Psi.
    Here exactly, each pass (N_d - 1)/N_d Psi elements: DP's all-reduce two passes of gradients; ZeRO-1/2 a
    reduce-scatter of gradients and an all-gather of the updated parameters; ZeRO-3 a reduce-scatter and two
    all-gathers of parameters. Gradients move ``grad_bytes`` per element, parameters ``weight_bytes`` (default
    ``grad_bytes``: the paper's 2 Psi and 3 Psi; 1 where the weights are gathered in float8 — Megatron's
    ``--fp8-param-gather``, torchao's FSDP2 float8 all-gather).
    """
    positive("n_params", n_params)
    choice("zero_stage", zero_stage, (0, 1, 2, 3))
    whole("dp", dp)
    positive("grad_bytes", grad_bytes)
    weight_bytes = grad_bytes if weight_bytes is None else weight_bytes
    positive("weight_bytes", weight_bytes)
    gathers = {0: 0, 1: 1, 2: 1, 3: 2}[zero_stage]
    passes = grad_bytes * (2 if zero_stage == 0 else 1) + weight_bytes * gathers
    return (dp - 1) / dp * n_params * passes


def hsdp_step_comm_bytes(n_params: float, zero_stage: int, replicate: int, shard: int, grad_bytes: float = 2,
                         weight_bytes: float | None = None) -> dict[str, float]:
    """Bytes each rank sends per step under hybrid sharding (HSDP: replicate x shard ranks), the two reductions
    apart: {"shard": ZeRO's within the shard group — ``dp_step_comm_bytes`` over ``shard`` ranks (the reduce-
    scatter of the gradients and the parameter gathers), "replicate": the all-reduce of this rank's reduced
    gradient shard, Psi / shard elements, across the ``replicate`` replicas (a ring: 2 (R - 1) / R of it), "total"}.
    (n, 1) — every shard group one rank: the shard term is 0 and the replicas all-reduce whole gradients, DP's 2 Psi;
    (1, n) is ZeRO over n ranks."""
    positive("n_params", n_params)
    choice("zero_stage", zero_stage, (1, 2, 3))
    whole("replicate", replicate)
    whole("shard", shard)
    positive("grad_bytes", grad_bytes)
    within = dp_step_comm_bytes(n_params, zero_stage, shard, grad_bytes, weight_bytes)
    across = collective_bytes("all_reduce", replicate, n_params / shard * grad_bytes)
    return {"shard": within, "replicate": across, "total": within + across}


def tp_layer_comm_bytes(batch: int, seq: int, hidden: int, tp: int, activation_bytes: float = 2) -> float:
    """Bytes each tensor-parallel rank sends per transformer layer per microbatch.

    Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters"), section
    3.3: 4 all-reduces of the b x s x h activations per layer per microbatch (2 in the forward, 2 in
    the backward), each a ring all-reduce: 4 * 2(t - 1)/t * b s h * activation_bytes.
    """
    for name, value in (("batch", batch), ("seq", seq), ("hidden", hidden), ("tp", tp)):
        whole(name, value)
    return 4 * collective_bytes("all_reduce", tp, batch * seq * hidden * activation_bytes)
