"""The DeepSpeed stack's ``save`` / ``load``: DeepSpeed's own checkpoints (``engine.save_checkpoint`` /
``load_checkpoint``), and, where its native checkpoint does not load on the new layout, its documented route —
the universal checkpoint (``ds_to_universal``, run on rank 0, then ``load_universal_checkpoint``).

Which route (measured with deepspeed 0.19.8, suites/resume/test_deepspeed.py): the same dp and pp loads
natively (a ZeRO stage change too), and ZeRO 0 at another dp; ZeRO 1-3 at another dp or pp goes universal
(DeepSpeed refuses it natively; its conversion assumes Adam's state: SGD fails with KeyError 'exp_avg', the
zero suite's finding). At one world size the plain engine's dp is fixed, so across layouts means across its
pipeline's pp x dp. Not composed: a checkpoint of the plain engine into a pipeline engine or back (one is a
model file per rank, the other a file per layer, under other parameter names), nor ZeRO 0 at another pp."""

from __future__ import annotations

import json
from pathlib import Path

import torch.distributed as dist

from harness.adapters.deepspeed.universal import ask_universal


class DeepSpeedCheckpoint:
    """Mixed into both DeepSpeed stack trainers: ``engine`` (the built engine), ``layout``, ``recipe``;
    ``kind``: "engine" or "pipeline"."""

    kind = "engine"
    resumes_lr_schedule = True
    """``save`` / ``load`` carry the client scheduler's position (DeepSpeed's checkpoint holds its state_dict)."""

    def save(self, directory) -> None:
        path = Path(directory) / "deepspeed"
        engine = self.engine
        tag = f"step-{engine.global_steps}"
        engine.save_checkpoint(str(path), tag=tag)
        if dist.get_rank() == 0:
            meta = {"kind": self.kind, "dp": self.layout.dp, "pp": self.layout.pp, "zero": self.layout.zero,
                    "tag": tag}
            (path / "layout.json").write_text(json.dumps(meta))
        dist.barrier()

    def load(self, directory) -> None:
        path = Path(directory) / "deepspeed"
        meta = json.loads((path / "layout.json").read_text())
        if meta["kind"] != self.kind:
            raise NotImplementedError(
                f"a DeepSpeed {meta['kind']} checkpoint does not load into its {self.kind}: one writes a model file "
                "per rank, the other a file per layer, under other parameter names.")
        moved = meta["dp"] != self.layout.dp or meta["pp"] != self.layout.pp
        if moved and meta["zero"] == 0 and meta["pp"] != self.layout.pp:
            raise NotImplementedError(
                f"DeepSpeed's ZeRO 0 pipeline checkpoint keeps each stage's optimizer state in that stage's file: "
                f"it does not load at pp {self.layout.pp} (written at pp {meta['pp']}); ZeRO 1 goes universal.")
        engine = self.engine
        across_stage_3 = (meta["zero"] == 3) != (self.layout.zero == 3)
        if (moved and meta["zero"] > 0) or across_stage_3:  # DeepSpeed's documented route: universal
            if dist.get_rank() == 0:
                from harness.resume.deepspeed_ckpt import to_universal

                to_universal(str(path), meta["tag"].removeprefix("step-"))
            dist.barrier()
            path = Path(f"{path}-universal")
            ask_universal(engine)
        scheduled = engine.lr_scheduler is not None  # the contract's schedule, a client scheduler
        loaded, _ = engine.load_checkpoint(str(path), tag=meta["tag"], load_optimizer_states=True,
                                           load_lr_scheduler_states=scheduled)
        if loaded is None:
            raise RuntimeError(f"DeepSpeed's load_checkpoint loaded nothing from {path} (tag {meta['tag']}).")
        if scheduled:  # its position loaded; each group's lr from it (whatever route set the optimizer's groups)
            scheduler = engine.lr_scheduler
            for group, lr in zip(scheduler.optimizer.param_groups, scheduler.get_last_lr(), strict=True):
                group["lr"] = lr
