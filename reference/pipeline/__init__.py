"""Pipeline parallelism: schedules as data — generate, validate, simulate, draw."""

from . import generators
from .generators import (
    GENERATORS,
    INTERLEAVED,
    V_SHAPED,
    dualpipev,
    generate,
    gpipe,
    interleaved_1f1b,
    interleaved_zb,
    one_f_one_b,
    placement,
    stages_per_rank,
    zb_h1,
    zbv,
)
from .schedule import Action, Schedule, add_send_recv
from .simulate import DeadlockError, Timeline, simulate

FUSED_BACKWARD, SPLIT_BACKWARD = generators.FUSED_BACKWARD, generators.SPLIT_BACKWARD

__all__ = ["Action", "DeadlockError", "FUSED_BACKWARD", "GENERATORS", "INTERLEAVED", "SPLIT_BACKWARD", "V_SHAPED",
           "dualpipev", "generate", "Schedule", "Timeline", "add_send_recv", "gpipe", "interleaved_1f1b",
           "interleaved_zb", "one_f_one_b", "placement", "simulate", "stages_per_rank", "zb_h1", "zbv"]

from .validate import ScheduleError, validate  # noqa: E402

__all__ += ["ScheduleError", "validate"]
