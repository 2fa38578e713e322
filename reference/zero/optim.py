"""Which optimizer a data-parallel / ZeRO trainer builds, and how much state it keeps per parameter."""

from __future__ import annotations

from dataclasses import dataclass

import torch

OPTIMIZERS = ("sgd", "adam", "adamw", "muon")
DECAY_RULES = ("all", "matrices")
NS_DTYPES = ("bfloat16", "float64")


@dataclass(frozen=True)
class OptimizerSpec:
    name: str
    """"sgd" (with momentum), "adam", "adamw" (Adam with decoupled weight decay: torch's AdamW, ``weight_decay`` by
    ``decay``'s rule), or "muon": Muon for the hidden matrices, AdamW for the rest
    (``reference.muon.MuonSpec``'s rule: the embedding, the LM head and every vector) — ``build_named``."""
    lr: float
    """Learning rate."""
    momentum: float = 0.9
    """SGD's momentum (its one state tensor per parameter, ``momentum_buffer``)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam's betas (state ``exp_avg`` and ``exp_avg_sq``, two tensors per parameter)."""
    eps: float = 1e-8
    """Adam's epsilon."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay (each step a decayed parameter is first multiplied by 1 - lr x weight_decay:
    torch's), Muon's and its AdamW's (sgd / adam: none, 0)."""
    decay: str = "all"
    """Which parameters AdamW decays: "all" (torch's AdamW over the model's parameters, torchtitan's one group) or
    "matrices" — those of two or more dimensions (embeddings, the head, the projections), not the biases and norms:
    Megatron's rule (its standard overrides: a bias or a 1-D parameter has wd_mult 0) and the HF Trainer's (not a
    bias, not a LayerNorm's weight). The dense parameter's shape decides, however a stack shards it."""
    nesterov: bool = True
    """Muon's Nesterov momentum (torch's default)."""
    adjust_lr_fn: str | None = None
    """Muon's learning-rate adjustment by the matrix's shape: torch's None / "original", "match_rms_adamw" or (torch
    2.15's) "spectral_unclamped"."""
    adamw_lr: float | None = None
    """The learning rate of Muon's AdamW (the embedding, head and vectors); None: ``lr``."""
    ns_dtype: str = "bfloat16"
    """Muon's Newton-Schulz precision: torch's bfloat16; "float64" is exact arithmetic's stand-in (the one-device
    run a Muon case's E_T is measured from: ``harness.stack.muon``)."""

    def __post_init__(self):
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer {self.name!r} is not one of {', '.join(OPTIMIZERS)}.")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive; got {self.lr}.")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0; got {self.weight_decay}.")
        # torch.optim's own ranges (SGD's momentum, Adam's betas and eps), said here once for every stack
        if not self.momentum >= 0:
            raise ValueError(f"momentum must be >= 0; got {self.momentum}.")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1); got {self.betas}.")
        if not self.eps >= 0:
            raise ValueError(f"eps must be >= 0; got {self.eps}.")
        if self.name not in ("adamw", "muon") and self.weight_decay:
            raise ValueError(f"weight_decay is AdamW's and Muon's; {self.name} here trains without it (adamw is Adam "
                             "with a decoupled weight decay).")
        if self.decay not in DECAY_RULES:
            raise ValueError(f"decay must be one of {', '.join(DECAY_RULES)}; got {self.decay!r}.")
        if self.decay != "all" and self.name != "adamw":
            raise ValueError(f"decay (which parameters decay) is AdamW's rule; {self.name} decays "
                             f"{'every parameter its AdamW steps' if self.name == 'muon' else 'none'}.")
        if self.ns_dtype not in NS_DTYPES:
            raise ValueError(f"ns_dtype must be one of {', '.join(NS_DTYPES)}; got {self.ns_dtype!r}.")
        if self.name == "muon":
            self.muon()  # its checks (adjust_lr_fn), its sentences

    @property
    def adam(self) -> bool:
        """Adam's step and state (Adam, AdamW)."""
        return self.name in ("adam", "adamw")

    def decays(self, shape) -> bool:
        """Whether AdamW decays a parameter of this (dense) shape."""
        return self.name == "adamw" and self.weight_decay > 0 and (self.decay == "all" or len(shape) >= 2)

    def build(self, params, masks=None) -> torch.optim.Optimizer:
        """The optimizer over ``params`` (tensors, or torch's parameter groups). AdamW's rule "matrices" reads each
        tensor's shape; a flat shard's elements decay by ``masks`` (per tensor, bool, shaped like it:
        ``reference.zero.flat.FlatParams.decaying``) — ``reference.zero.adamw.MaskedAdamW``."""
        cls, kwargs = self.torch_class()
        if self.name == "adamw" and masks is not None and self.decay != "all":
            from .adamw import MaskedAdamW

            return MaskedAdamW(params, masks, **kwargs)
        return cls(self.param_groups(params), **kwargs)

    def torch_class(self) -> tuple[type, dict]:
        """torch's optimizer class for sgd / adam / adamw and its keyword arguments (what ``build`` constructs; what a
        wrapper taking an ``optimizer_class``, such as ``ZeroRedundancyOptimizer``, is given)."""
        if self.name == "muon":
            raise ValueError("Muon takes the hidden matrices by name: build it with build_named((name, parameter) "
                             "pairs).")
        if self.name == "sgd":
            return torch.optim.SGD, {"lr": self.lr, "momentum": self.momentum}
        adam = {"lr": self.lr, "betas": self.betas, "eps": self.eps}
        return (torch.optim.Adam, adam) if self.name == "adam" else \
            (torch.optim.AdamW, {**adam, "weight_decay": self.weight_decay})

    def param_groups(self, params) -> list:
        """``params`` (tensors or groups) as AdamW's groups: rule "matrices" splits each group into the tensors of two
        or more dimensions and the rest (weight_decay 0); every other rule and optimizer keeps them."""
        params = list(params)
        if not params:
            return params
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        if self.name != "adamw" or self.decay == "all":
            return groups
        out = []
        for group in groups:
            tensors = list(group["params"])
            for decayed in (True, False):
                part = [p for p in tensors if (p.dim() >= 2) == decayed]
                if part:
                    out.append({**group, "params": part} | ({} if decayed else {"weight_decay": 0.0}))
        return out

    def build_named(self, named, shards: dict | None = None):
        """The optimizer over ``named`` ((name, parameter) pairs; the names decide Muon's matrices): ``build``'s for
        sgd / adam; for muon ``reference.muon.MuonAdamW`` — torch's Muon and AdamW, or with ``shards`` ({id(param):
        (dim, group, replicas)}: a matrix split over a group along dim, ``tp_split_matrices``) or ``ns_dtype``
        float64 the reference iteration, each matrix gathered whole."""
        named = list(named)
        if self.name != "muon":
            return self.build([p for _, p in named])
        from reference.muon.optimizer import MuonAdamW

        return MuonAdamW(named, self.muon(), getattr(torch, self.ns_dtype), shards or {})

    def build_flat(self, master, flat, named, shards: dict | None = None):
        """The optimizer ZeRO 1/2 steps this rank's flat shard ``master`` with (``reference.zero.ShardedOptimizer``):
        ``build``'s over it for sgd / adam; for muon ``reference.muon.flat.FlatMuon`` — the matrices' updates gathered
        whole from the ranges (``named``: the flat's parameters, named; ``shards``: as ``build_named``'s)."""
        if self.name != "muon":
            return self.build([master], [flat.decaying(self)[flat.shard]])
        from reference.muon.flat import FlatMuon

        return FlatMuon(master, flat, list(named), self.muon(), getattr(torch, self.ns_dtype), shards or {})

    def muon(self):
        """This spec as ``reference.muon.MuonSpec`` (Muon's hyper-parameters and its AdamW's)."""
        from reference.muon import MuonSpec

        spec = MuonSpec(lr=self.lr, momentum=self.momentum, nesterov=self.nesterov, weight_decay=self.weight_decay,
                        adjust_lr_fn=self.adjust_lr_fn, adamw_lr=self.adamw_lr or self.lr, adamw_betas=self.betas,
                        adamw_eps=self.eps, adamw_weight_decay=self.weight_decay)
        spec.adjusted_lr((1, 1))  # an unknown adjustment: its sentence now
        return spec

    def takes_muon(self, name: str, shape) -> bool:
        """Muon steps this parameter (the rest of a Muon spec's: AdamW; sgd / adam: none)."""
        return self.name == "muon" and self.muon().takes(name, shape)

    @property
    def state_keys(self) -> tuple[str, ...]:
        """The per-element state tensors (Adam's scalar ``step`` is not one); Muon's: every key of either of its
        optimizers — a parameter's own are ``state_keys_of``."""
        return {"sgd": ("momentum_buffer",), "adam": ("exp_avg", "exp_avg_sq"), "adamw": ("exp_avg", "exp_avg_sq"),
                "muon": ("momentum_buffer", "exp_avg", "exp_avg_sq")}[self.name]

    @property
    def extra_state(self) -> tuple[str, ...]:
        """Per-parameter state that is not per element: Adam's ``step`` (the same count for every parameter)."""
        return ("step",) if self.name in ("adam", "adamw", "muon") else ()

    def state_keys_of(self, name: str, shape) -> tuple[str, ...]:
        """Parameter ``name``'s per-element state: Muon's matrices its momentum, its AdamW's the two moments."""
        if self.name != "muon":
            return self.state_keys
        return ("momentum_buffer",) if self.takes_muon(name, shape) else ("exp_avg", "exp_avg_sq")

    def extra_state_of(self, name: str, shape) -> tuple[str, ...]:
        if self.name != "muon":
            return self.extra_state
        return () if self.takes_muon(name, shape) else ("step",)

    def state_bytes_per_param(self, element_size: int) -> int:
        """K of the ZeRO paper for this optimizer in this precision (no separate master copy)."""
        if self.name == "muon":
            raise ValueError("Muon keeps one state tensor per matrix element and AdamW's two per other element: count "
                             "them per parameter (state_keys_of).")
        return len(self.state_keys) * element_size


@dataclass(frozen=True)
class StepRecipe:
    """How a data-parallel / ZeRO trainer turns a step's rows into one optimizer step, beyond the plain
    case (one backward, no clipping)."""

    accumulation: int = 1
    """Micro-steps per optimizer step: ``step(x, y)`` splits its rows into this many equal parts, runs
    forward and backward on each with the loss divided by ``accumulation`` (so the micro-steps' gradients
    sum to the slice's mean-loss gradient), and reduces over the group once, after the last."""
    max_grad_norm: float | None = None
    """Clip the reduced gradient's global norm (over the whole model, each element once) to this."""
    norm_type: float = 2.0
    """2 or inf."""
    masked: bool = False
    """Target rows of NaN count nothing (``reference.zero.masked``): the loss is the mean squared error over
    the global batch's counted rows; ``step`` all-reduces its slice's count (``share``) and back-propagates
    each micro-step's summed squared error over its counted rows divided by that share."""

    def share(self, y: torch.Tensor, group=None) -> float | None:
        """masked: this rank's divisor (``reference.zero.masked.share``, a collective over ``group``); else None."""
        if not self.masked:
            return None
        from .masked import share

        return share(y, group)

    def micro_loss(self, out: torch.Tensor, y: torch.Tensor, share: float | None) -> torch.Tensor:
        """A micro-step's loss to back-propagate (its gradients sum, over micro-steps, to the slice's part of
        the step's): ``F.mse_loss / accumulation``; masked, its counted rows' summed squared error / ``share``."""
        if not self.masked:
            return torch.nn.functional.mse_loss(out, y) / self.accumulation
        from .masked import summed_squared_error

        return summed_squared_error(out, y) / share

    def __post_init__(self):
        if not (isinstance(self.accumulation, int) and self.accumulation >= 1):
            raise ValueError(f"accumulation must be a whole number >= 1; got {self.accumulation!r}.")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be positive; got {self.max_grad_norm}.")
        if self.norm_type not in (2.0, float("inf")):
            raise ValueError(f"norm_type must be 2 or inf; got {self.norm_type}.")

    def split(self, x: torch.Tensor, y: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The micro-steps' (x, y): equal row blocks (the rows must divide)."""
        if len(x) % self.accumulation:
            raise ValueError(f"{len(x)} rows cannot be split into {self.accumulation} equal micro-steps.")
        return list(zip(x.chunk(self.accumulation), y.chunk(self.accumulation), strict=True))
