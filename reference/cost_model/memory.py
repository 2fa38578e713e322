"""Per-device memory: model states under ZeRO (Rajbhandari et al. 2020) and activations
(Korthikanti et al. 2022)."""

from __future__ import annotations

from dataclasses import dataclass

from ._checks import choice, positive, whole


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes one device holds for each kind of model state."""

    weights: float
    """Parameters in training precision (2 bytes each for fp16/bf16)."""
    gradients: float
    """Gradients in training precision."""
    optimizer: float
    """Optimizer state: for mixed-precision Adam K = 12 bytes per parameter (fp32 master, m, v)."""

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def training_memory(n_params: float, *, zero_stage: int = 0, dp: int = 1, tp: int = 1, pp: int = 1,
                    weight_bytes: float = 2, grad_bytes: float = 2, optimizer_bytes: float = 12) -> MemoryBreakdown:
    """Model-state bytes per device for mixed-precision training with ZeRO stage 0-3.

    Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
    section 5 and figure 1, with Psi = n_params / (tp * pp) the parameters this device's model shard
    holds, K = optimizer_bytes and N_d = dp (here with 2-byte weights and gradients):

        stage 0: (2 + 2 + K) Psi          stage 2: 2 Psi + (2 + K) Psi / N_d
        stage 1: 4 Psi + K Psi / N_d      stage 3: (2 + 2 + K) Psi / N_d

    70B parameters on one device: 140 GB weights + 140 GB gradients + 840 GB Adam state = 1.12 TB.
    """
    positive("n_params", n_params)
    choice("zero_stage", zero_stage, (0, 1, 2, 3))
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp)):
        whole(name, value)
    for name, value in (("weight_bytes", weight_bytes), ("grad_bytes", grad_bytes),
                        ("optimizer_bytes", optimizer_bytes)):
        positive(name, value, allow_zero=True)
    psi = n_params / (tp * pp)
    return MemoryBreakdown(
        weights=weight_bytes * psi / (dp if zero_stage >= 3 else 1),
        gradients=grad_bytes * psi / (dp if zero_stage >= 2 else 1),
        optimizer=optimizer_bytes * psi / (dp if zero_stage >= 1 else 1),
    )


OFFLOADS = ("none", "optimizer", "parameters")
OFFLOAD_MIN_STAGE = {"none": 0, "optimizer": 1, "parameters": 3}
"""The lowest ZeRO stage each offload runs at: the host holds this rank's shard of what it offloads."""


def offloaded_memory(n_params: float, *, zero_stage: int, dp: int = 1, tp: int = 1, pp: int = 1,
                     weight_bytes: float = 2, grad_bytes: float = 2, optimizer_bytes: float = 12,
                     offload: str = "optimizer") -> tuple[MemoryBreakdown, MemoryBreakdown]:
    """(device, host) model-state bytes per rank with part of the state kept in host memory, Psi and K as in
    ``training_memory``:

    - ``optimizer`` (ZeRO-Offload, Ren et al. 2021, section 4; DeepSpeed's ``offload_optimizer`` at ZeRO 1-3): the
      host holds this rank's shard of the optimizer state, K Psi / N_d, and of the reduced gradients,
      G Psi / N_d — the update runs there; the device keeps the weights as the stage holds them (W Psi; W Psi / N_d
      at stage 3).
    - ``parameters`` (ZeRO 3 only: DeepSpeed's ``offload_param`` with ``offload_optimizer``, FSDP2's
      ``CPUOffloadPolicy``): the weight shard W Psi / N_d on the host too — the device holds no model state between
      steps.

    Not counted, as ``training_memory`` counts none: the transient buffers (a layer's gathered weights and
    gradients while it computes, the reduction buckets, pinned staging copies). ``none``: ``training_memory`` and
    an empty host."""
    choice("offload", offload, OFFLOADS)
    states = training_memory(n_params, zero_stage=zero_stage, dp=dp, tp=tp, pp=pp, weight_bytes=weight_bytes,
                             grad_bytes=grad_bytes, optimizer_bytes=optimizer_bytes)
    if offload == "none":
        return states, MemoryBreakdown(0.0, 0.0, 0.0)
    lowest = OFFLOAD_MIN_STAGE[offload]
    if zero_stage < lowest:
        stages = "3" if lowest == 3 else f"{', '.join(map(str, range(lowest, 3)))} or 3"
        raise ValueError(f"offloading the {offload} needs ZeRO {stages} (the host holds this rank's shard); got ZeRO "
                         f"{zero_stage}.")
    shard = n_params / (tp * pp * dp)
    host = MemoryBreakdown(weights=weight_bytes * shard if offload == "parameters" else 0.0,
                           gradients=grad_bytes * shard, optimizer=optimizer_bytes * shard)
    return MemoryBreakdown(weights=states.weights - host.weights, gradients=0.0, optimizer=0.0), host


RECOMPUTE = ("none", "selective", "full")


def activation_memory(seq: int, batch: int, hidden: int, heads: int, layers: int = 1, *, tp: int = 1,
                      sequence_parallel: bool = False, recompute: str = "none") -> float:
    """Activation bytes per device for ``layers`` transformer layers (16-bit activations).

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", table 2,
    with s = seq, b = batch, h = hidden, a = heads, t = tp, per layer:

        no parallelism                      s b h (34 + 5 a s / h)
        tensor parallel                     s b h (10 + 24 / t + 5 a s / (h t))
        tensor + sequence parallel          s b h (34 / t + 5 a s / (h t))
        tensor parallel + selective         s b h (10 + 24 / t)
        tensor + sequence + selective       s b h (34 / t)
        full recomputation                  2 s b h   (the layer's input only; / t with sequence parallel,
                                                       whose input is sharded along the sequence)

    With t = 1 the tensor-parallel rows reduce to the first. Embeddings and the output layer are not
    included (the paper's section 4.3 treats them separately).
    """
    for name, value in (("seq", seq), ("batch", batch), ("hidden", hidden), ("heads", heads),
                        ("layers", layers), ("tp", tp)):
        whole(name, value)
    choice("recompute", recompute, RECOMPUTE)
    if heads % tp:
        raise ValueError(f"tp ({tp}) must divide the number of heads ({heads}); valid tp: "
                         f"{', '.join(str(d) for d in range(1, heads + 1) if heads % d == 0)}.")
    sbh = seq * batch * hidden
    attention = 5 * heads * seq / (hidden * tp)
    if recompute == "full":
        per_layer = 2 * sbh / (tp if sequence_parallel else 1)
    elif sequence_parallel:
        per_layer = sbh * (34 / tp + (0 if recompute == "selective" else attention))
    else:
        per_layer = sbh * (10 + 24 / tp + (0 if recompute == "selective" else attention))
    return per_layer * layers
