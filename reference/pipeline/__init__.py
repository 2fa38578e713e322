"""Pipeline parallelism: schedules as data — generate, validate, simulate, draw."""

from . import generators
from .generators import GENERATORS, generate, gpipe, interleaved_1f1b, one_f_one_b, zb_h1
from .schedule import Action, Schedule, add_send_recv
from .simulate import DeadlockError, Timeline, simulate

FUSED_BACKWARD, SPLIT_BACKWARD = generators.FUSED_BACKWARD, generators.SPLIT_BACKWARD

__all__ = ["Action", "DeadlockError", "FUSED_BACKWARD", "GENERATORS", "SPLIT_BACKWARD", "generate", "Schedule",
           "Timeline", "add_send_recv", "gpipe", "interleaved_1f1b", "one_f_one_b", "simulate", "zb_h1"]

from .validate import ScheduleError, validate  # noqa: E402

__all__ += ["ScheduleError", "validate"]
