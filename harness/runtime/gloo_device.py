"""One gloo transport device per rank process, shared by every gloo process group it creates.

torch gives each new gloo process group its own TCP device, and each device runs a loop thread that wakes
every 10 ms (gloo's ``Loop::run``: ``epoll_wait(..., 10)``) for as long as the group lives. A rank of a
World lives for the whole session and the code under test creates groups in every case (a layout's dp /
tp / pp / cp / ep groups, megatron-core's parallel state, each DeviceMesh, DeepSpeed's groups), rarely
destroying them: measured on torch 2.13, an idle rank costs 1.5 ms of CPU per second per group it holds
(2 ranks: 0.01 CPU-s/s with no subgroup, 0.14 with 50, 0.47 with 150), and a full ``tox`` run held 901
such threads over its Worlds — about 70 % of a 2-core machine spent waking idle loops, every later suite
2-3x slower than it runs alone.

``share()`` makes the constructor that torch's ``new_group`` / ``init_process_group`` call build each
group on one device per process, created once exactly as torch would (the ``GLOO_SOCKET_IFNAME``
interfaces, else the default device) with torch's thread count for it (2 per device). Only the
transport's event loop is shared — every group keeps its own context, pairs and work threads, so what a
collective computes and which ranks it reaches are unchanged. gloo devices are built to be shared by
contexts (a device is the NIC; a context is a group). Instances made elsewhere in torch (split groups)
still pass its ``isinstance`` checks. Where this torch lays its gloo classes out otherwise, ``share()``
leaves torch as it is and returns False.

This is a private API of torch (``ProcessGroupGloo._Options`` and its ``_devices`` / ``_threads`` /
``_timeout``, a subclass of torch's backend class), so it is guarded twice: ``share()`` checks the layout
first, and the constructor hands any call it cannot serve exactly to torch's own constructor — the options
overload, and any keyword asking for something other than that keyword's default on the options (torch
2.14 added ``enable_reconfigure``, always passed, ``False`` unless a group asks for reconfiguration). A
fallback builds that group on torch's own device and says so once per process (``FALLBACKS``)."""

from __future__ import annotations

import os
import warnings
from datetime import timedelta

_DEVICES: list = []
FALLBACKS: list[str] = []
"""Why a group of this process was built by torch's own constructor (each reason once)."""


def share() -> bool:
    """Route every later gloo process group of this process onto one shared device (idempotent). Returns
    whether it is in place."""
    import torch.distributed.distributed_c10d as c10d

    base = getattr(c10d, "ProcessGroupGloo", None)
    if base is None or getattr(base, "_paritybench_shared", False):
        return base is not None
    if not all(hasattr(base, name) for name in ("_Options", "create_device", "create_default_device")):
        return False
    probe = base._Options()
    if not all(hasattr(probe, name) for name in ("_devices", "_threads", "_timeout")):
        return False

    class _Meta(type(base)):
        def __instancecheck__(cls, obj):  # torch's checks against its name also accept groups made in C++
            return isinstance(obj, base)

    class SharedDeviceGloo(base, metaclass=_Meta):
        _paritybench_shared = True

        def __init__(self, store, rank, size, timeout=timedelta(minutes=30), **keywords):
            options = base._Options()
            why = unshareable(timeout, keywords, options)
            if why is not None:  # torch's own constructor, as torch would have called it
                _fell_back(why)
                base.__init__(self, store, rank, size, timeout, **keywords)
                return
            options._devices = _devices(base)
            options._threads = 2 * len(options._devices)  # torch's own choice for these devices
            options._timeout = timeout
            base.__init__(self, store, rank, size, options)

    SharedDeviceGloo.__name__ = SharedDeviceGloo.__qualname__ = base.__name__
    SharedDeviceGloo.__module__ = base.__module__
    c10d.ProcessGroupGloo = SharedDeviceGloo
    return True


def unshareable(timeout, keywords: dict, options) -> str | None:
    """None where a group asked for with these constructor arguments is exactly what the shared device's
    options give (a timeout, and keywords each equal to the options' own default); else why not."""
    if not isinstance(timeout, timedelta):
        return "torch's options overload (the caller chose the devices itself)"
    for name, value in keywords.items():
        if not hasattr(options, name):
            return f"this torch's gloo constructor takes a keyword {name!r} that its options do not hold"
        if value != getattr(options, name):
            return f"a group asks for {name}={value!r}, which the shared device's options leave at their default"
    return None


def _fell_back(why: str) -> None:
    if why not in FALLBACKS:
        FALLBACKS.append(why)
        warnings.warn(f"paritybench: a gloo group is built on torch's own device: {why}.", RuntimeWarning,
                      stacklevel=3)


def _devices(base) -> list:
    """This process's devices, made on first use as torch's own constructor makes them."""
    if not _DEVICES:
        names = [n for n in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n]
        _DEVICES.extend([base.create_device(interface=n) for n in names] if names else
                        [base.create_default_device()])
    return list(_DEVICES)
