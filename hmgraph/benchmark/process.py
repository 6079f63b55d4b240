"""Each configuration in a process of its own, and what it used.

`isolated` runs a function in a fresh (``spawn``) process and returns its
value, or raises `ConfigurationFailed` with the child's traceback, exit
code or reads; `peak_rss_bytes` (`hmgraph.memory`'s, the one the
project uses) is this process's peak resident memory, its own, not a
parent's; `read_bytes` counts its reads from block devices.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback

import psutil

from hmgraph.memory import peak_rss_bytes

__all__ = [
    "ConfigurationFailed",
    "isolated",
    "peak_rss_bytes",
    "read_bytes",
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
    memory (`peak_rss_bytes`) is its own. An exception in the
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
    try:
        send.send((True, function(*args, **kwargs)))
    except Exception:  # noqa: BLE001 - carried to the parent
        send.send((False, traceback.format_exc()))
    finally:
        send.close()


def read_bytes() -> int:
    """Bytes this process has had read from block devices."""
    return int(psutil.Process().io_counters().read_bytes)
