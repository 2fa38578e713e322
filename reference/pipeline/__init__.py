"""Pipeline parallelism: schedules as data — generate, validate, simulate, draw."""

from .generators import GENERATORS, generate, gpipe, interleaved_1f1b, one_f_one_b, zb_h1
from .schedule import Action, Schedule, add_send_recv
from .simulate import DeadlockError, Timeline, simulate

__all__ = ["Action", "DeadlockError", "GENERATORS", "generate", "Schedule", "Timeline", "add_send_recv", "gpipe",
           "interleaved_1f1b", "one_f_one_b", "simulate", "zb_h1"]

from .validate import ScheduleError, validate  # noqa: E402

__all__ += ["ScheduleError", "validate"]
