"""Activation checkpointing: the case, the benchmark and the report section of ``paritybench bench checkpoint``. Its
``PARADIGM`` record is what the shared tools read."""

from harness.paradigm import Bench, Paradigm, Section
from harness.records.findings import Finding
from harness.records.registry import ImplSpec

PARADIGM = Paradigm(
    "checkpoint", 1, contract="harness.contracts.checkpoint:Checkpointing",
    builtins=(
        ImplSpec("reference", "checkpoint", "reference.checkpoint:ReferenceCheckpointing",
                 description="ours: an autograd function that restores the RNG state"),
        ImplSpec("torch", "checkpoint", "harness.adapters.torch.checkpoint:TorchCheckpointing",
                 description="torch.utils.checkpoint, use_reentrant=False"),
        ImplSpec("torch-reentrant", "checkpoint", "harness.adapters.torch.checkpoint:TorchCheckpointing",
                 {"use_reentrant": True}, description="torch.utils.checkpoint, use_reentrant=True"),
    ),
    findings=(
        Finding("torch-reentrant", "checkpoint", "torch", ("2.6", None),
                "torch.utils.checkpoint with use_reentrant=True and an input that does not require grad: the "
                "checkpointed segment's parameters get no gradient (every layer checkpointed: backward raises).",
                "suites/checkpoint/test_findings.py::test_reentrant_checkpoint_drops_parameter_gradients_when_the_"
                "input_needs_none", {"input_requires_grad": False},
                symptom=r"^step \d+: (parameter \d+ gradient missing|(weights|momentum) after the optimizer step "
                        r"differ|(output|input) differs)$|^forward or backward raised RuntimeError: element 0 of "
                        r"tensors does not require grad",
                cause=r"^step 1: parameter \d+ gradient missing$|^forward or backward raised RuntimeError: element 0 "
                      r"of tensors does not require grad"),
    ),
    benches=(
        Bench("checkpoint", "activation memory and step time with and without checkpointing",
              "harness.checkpoint.cli:plans", "harness.checkpoint.cli:add_arguments", in_all=4,
              own_world_size="it runs in this process, on no ranks"),
    ),
    sections=(Section(100, "harness.checkpoint.report:checkpoint_section", suite="checkpoint"),),
)
