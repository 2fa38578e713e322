"""One contract per paradigm, as a ``typing.Protocol``; implementations satisfy them structurally.

An implementation that does not support an operation raises ``Unsupported`` (any
``NotImplementedError`` counts): the suites report it as ``unsupported``, never as a pass or a failure.
"""

from reference.errors import Unsupported

from .checkpoint import Checkpointing
from .collectives import Collectives
from .context_parallel import ContextParallel
from .expert_parallel import ExpertParallel
from .pipeline import Pipeline
from .stack import Stack, StackTrainer
from .tensor_parallel import TensorParallel
from .zero import Zero, ZeroTrainer


def __getattr__(name: str):
    if name == "CONTRACTS":  # paradigm -> Protocol, from each paradigm's record (harness.paradigm.contracts)
        from ..paradigm import contracts

        return contracts()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CONTRACTS", "Checkpointing", "Collectives", "ContextParallel", "ExpertParallel", "Pipeline", "Stack",
           "StackTrainer", "TensorParallel", "Unsupported", "Zero", "ZeroTrainer"]
