"""Each configuration in a process of its own, and what it used.

`isolated` runs a function in a fresh (``spawn``) process and returns its
value, or raises `ConfigurationFailed` with the child's traceback, exit
code or reads; `watch_memory` and `peak_rss_bytes` sample this process's
resident memory (its own peak, not a parent's); `read_bytes` counts its
reads from block devices.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
import traceback

import psutil

__all__ = [
    "ConfigurationFailed",
    "isolated",
    "peak_rss_bytes",
    "read_bytes",
    "watch_memory",
]


class ConfigurationFailed(RuntimeError):
    """One configuration's process failed; ``stderr`` holds its trace."""

    def __init__(self, name: str, stderr: str):
        last = (stderr.strip().splitlines() or [""])[-1]
        super().__init__(f"configuration {name} failed: {last}")
        self.name = name
        self.stderr = stderr


def isolated(function, *args, timeout: float | None = None, **kwargs):
    """``function(*args, **kwargs)`` in a fresh process; its return value.

    ``spawn``: the child imports anew and shares no memory; its peak
    memory is sampled from its start (`watch_memory`). An exception in the
    child, its death (the OOM killer's SIGKILL), or a child still running
    after ``timeout`` seconds (then killed, e.g. a memmap gather stuck in
    page faults) raises `ConfigurationFailed` here with the child's
    traceback, exit code or block-device reads.
    """
    context = mp.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child,
                            args=(send, function, args, kwargs))
    child.start()
    send.close()
    name = function.__name__
    try:
        if not receive.poll(timeout):
            read = psutil.Process(child.pid).io_counters().read_bytes
            child.kill()
            child.join()
            raise ConfigurationFailed(
                name, f"killed after its limit of {timeout:.0f} s, having "
                f"read {read / 1e9:.1f} GB from block devices")
        ok, value = receive.recv()
    except EOFError:
        child.join()
        raise ConfigurationFailed(
            name, f"died with exit code {child.exitcode} (-9: killed, e.g. "
            f"by the OOM killer)") from None
    child.join()
    if not ok:
        raise ConfigurationFailed(name, value)
    return value


def _child(send, function, args, kwargs) -> None:
    watch_memory()
    try:
        send.send((True, function(*args, **kwargs)))
    except Exception:  # noqa: BLE001 - carried to the parent
        send.send((False, traceback.format_exc()))
    finally:
        send.close()


_peak = {"bytes": 0, "thread": None}


def watch_memory(interval: float = 0.01) -> None:
    """Sample this process's resident memory (psutil) every ``interval``
    seconds from now on, in a daemon thread; idempotent.

    psutil has no peak on Linux, and ``ru_maxrss`` of a spawned process
    starts at its parent's peak: a child of a 300 MB parent reports 300
    MB. A peak sampled here misses spikes shorter than ``interval``.
    """
    if _peak["thread"] is not None:
        return
    process = psutil.Process()

    def sample() -> None:
        while True:
            _peak["bytes"] = max(_peak["bytes"], process.memory_info().rss)
            time.sleep(interval)

    _peak["thread"] = threading.Thread(target=sample, daemon=True,
                                       name="peak-rss")
    _peak["thread"].start()


def peak_rss_bytes() -> int:
    """Most resident memory seen since `watch_memory` (started here if
    not yet)."""
    watch_memory()
    _peak["bytes"] = max(_peak["bytes"], psutil.Process().memory_info().rss)
    return _peak["bytes"]


def read_bytes() -> int:
    """Bytes this process has had read from block devices."""
    return int(psutil.Process().io_counters().read_bytes)
