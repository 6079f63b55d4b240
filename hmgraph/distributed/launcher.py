"""Start DGL servers and trainers on this machine, and take them down.

`launch` is what ``hmgraph train-dist`` runs. One machine stands in for a
cluster: every part gets its own "machine" line in DGL's ip_config (all on
127.0.0.1, one port each), one `DistGraphServer` process, and
``trainers / parts`` trainer processes. The launcher watches them all:

* when every trainer has exited 0, it waits for the servers (the trainers
  shut them down) and returns the result rank 0 wrote;
* when any process dies (non-zero exit or a signal) or a server exits
  while trainers still run, it stops every other process and raises
  `LaunchError` naming the dead one;
* on Ctrl-C or when ``timeout`` seconds pass, it stops them all too.

Stopping is SIGTERM, then SIGKILL after a grace period; a SIGTERM to the
launcher stops the job as Ctrl-C does. Both handlers are installed whatever
the launcher inherited: started with SIGINT ignored (``nohup``, ``make
test &`` in a script) it still stops on SIGINT. Workers also exit on their
own when the launcher disappears, and the next launch removes the shared
memory and work folders of launchers that were killed (`remove_leftovers`).
Nothing listens beyond the loopback: the trainers meet through a file, gloo
binds to ``lo`` and DGL's servers to 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from hmgraph.partition import read_partition_info

__all__ = ["LaunchError", "free_port", "launch", "remove_leftovers"]


class LaunchError(RuntimeError):
    """A distributed job failed: a process died, or it timed out."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class _Process:
    def __init__(self, name: str, popen: subprocess.Popen):
        self.name = name
        self.popen = popen

    @property
    def label(self) -> str:
        return f"{self.name} (pid {self.popen.pid})"


def _stop(processes, grace: float = 5.0) -> None:
    alive = [p for p in processes if p.popen.poll() is None]
    for p in alive:
        try:
            p.popen.terminate()
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for p in alive:
        try:
            p.popen.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.popen.kill()
            p.popen.wait()


def _dump_stacks(processes, wait: float = 2.0) -> None:
    """Ask the processes still running to print their Python stacks
    (`worker.STACKS_SIGNAL`) to their stderr, and give them ``wait``
    seconds to do it."""
    # Lazy: the worker runs as `python -m hmgraph.distributed.worker`, and
    # runpy warns when the package has imported that module before.
    from hmgraph.distributed.worker import STACKS_SIGNAL

    alive = [p for p in processes if p.popen.poll() is None]
    for p in alive:
        try:
            p.popen.send_signal(STACKS_SIGNAL)
        except ProcessLookupError:
            pass
    if alive:
        time.sleep(wait)


def launch(parts_dir: str | os.PathLike, trainers: int, settings: dict, *,
           timeout: float | None = None, log=print, workdir=None) -> dict:
    """Train on the partitions in ``parts_dir`` with ``trainers`` processes.

    Parameters
    ----------
    parts_dir : str or os.PathLike
        Written by ``hmgraph partition``.
    trainers : int
        Trainer processes in all; a multiple of the number of parts.
    settings : dict
        The trainers' settings: ``model``, ``hidden``, ``dropout``,
        ``lr``, ``fanouts``, ``batch_size`` (per trainer), ``epochs``,
        ``seed``, ``cache``, ``device_budget``, ``host_budget``,
        ``device``, ``log_every``.
    timeout : float, optional
        Seconds before the whole job is stopped.
    log : callable
        Receives one line per event (process started, stopped).
    workdir : str or os.PathLike, optional
        Where the ip_config, job and result files go; default a
        temporary folder.

    Returns
    -------
    dict
        ``accuracy`` (valid, test) and one record per trainer.

    Raises
    ------
    LaunchError
        If a process dies, or ``timeout`` passes.
    """
    info = read_partition_info(parts_dir)
    num_parts = info["num_parts"]
    if not isinstance(trainers, int) or trainers < 1 \
            or trainers % num_parts:
        raise ValueError(
            f"trainers={trainers!r} must be a positive multiple of the "
            f"{num_parts} parts in {parts_dir}"
        )
    remove_leftovers()
    owned = tempfile.TemporaryDirectory(
        prefix=f"{_WORK_PREFIX}{os.getpid()}-") if workdir is None else None
    work = Path(workdir or owned.name)
    work.mkdir(parents=True, exist_ok=True)
    job, job_path = _write_job(work, parts_dir, info, trainers, settings)
    done = [Path(job["done"].format(rank=r)) for r in range(trainers)]
    env = dict(os.environ, OMP_NUM_THREADS=str(settings.get("threads", 1)))
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    command = [sys.executable, "-m", "hmgraph.distributed.worker"]
    servers, workers = [], []
    # SIGINT and SIGTERM stop the job: processes, memory, folders; also
    # when SIGINT came ignored (Python then installs no handler of its own).
    previous = {signum: signal.signal(signum, handler) for signum, handler
                in ((signal.SIGINT, signal.default_int_handler),
                    (signal.SIGTERM, _terminate))}
    try:
        for rank in range(num_parts):
            popen = subprocess.Popen(
                [*command, "server", str(job_path), str(rank)], env=env)
            servers.append(_Process(f"server {rank}", popen))
            log(f"started {servers[-1].label}")
        for rank in range(trainers):
            popen = subprocess.Popen(
                [*command, "trainer", str(job_path), str(rank)], env=env)
            workers.append(_Process(f"trainer {rank}", popen))
            log(f"started {workers[-1].label}")
        _watch(servers, workers, timeout, log, done=done)
        result = json.loads(Path(job["result"]).read_text())
    finally:
        for signum, handler in previous.items():
            if handler is not None:  # None: not installed from Python
                signal.signal(signum, handler)
        _stop(servers + workers)
        _remove_shared_memory(f"hmg{os.getpid()}m")
        if owned is not None:
            owned.cleanup()
    return result


_WORK_PREFIX = "hmgraph-dist-"


def _write_job(work: Path, parts_dir, info: dict, trainers: int,
               settings: dict) -> tuple[dict, Path]:
    """Write the job's ip_config and job file into ``work``.

    The job is ``settings`` plus what every worker needs to find the
    others: the partition's files, DGL's ip_config (one free port on
    127.0.0.1 per part), the rendezvous file, the result and ``done``
    file names. ``done`` files of an earlier job in ``work`` are removed.

    Returns
    -------
    tuple
        ``(job, job_path)``: the job dict and its JSON file.
    """
    num_parts = info["num_parts"]
    with open(info["config"]) as f:
        config = json.load(f)
    ip_config = work / "ip_config.txt"
    ip_config.write_text("".join(f"127.0.0.1 {free_port()}\n"
                                 for _ in range(num_parts)))
    job = {
        **settings,
        "parts_dir": str(Path(parts_dir).resolve()),
        "part_config": str(Path(info["config"]).resolve()),
        "ip_config": str(ip_config),
        "num_parts": num_parts,
        "trainers": trainers,
        "node_map": config["node_map"]["_N"],
        "num_classes": info["dataset"]["num_classes"],
        # Rendezvous through a file: no listening socket beyond DGL's
        # servers (on 127.0.0.1) and gloo's pairs (on the loopback).
        "store": str(work / "rendezvous"),
        "launcher_pid": os.getpid(),
        "result": str(work / "result.json"),
        "done": str(work / "done-{rank}"),
    }
    for rank in range(trainers):  # an earlier job's, in a reused workdir
        Path(job["done"].format(rank=rank)).unlink(missing_ok=True)
    job_path = work / "job.json"
    job_path.write_text(json.dumps(job, indent=2))
    return job, job_path


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def _remove_shared_memory(prefix: str) -> None:
    """Unlink what killed servers left in /dev/shm (see `loopback`)."""
    shm = Path("/dev/shm")
    if shm.is_dir():
        for path in shm.glob(prefix + "*"):
            path.unlink(missing_ok=True)


def remove_leftovers() -> list[str]:
    """Remove what launchers that died (SIGKILL) left behind.

    Shared-memory segments ``/dev/shm/hmg<pid>m*`` and work folders
    ``<tmp>/hmgraph-dist-<pid>-*`` carry their launcher's pid; those of
    pids no longer running are removed. Called by every launch.

    Returns
    -------
    list of str
        The paths removed.
    """
    removed = []
    shm = Path("/dev/shm")
    for path in shm.glob("hmg*m*") if shm.is_dir() else []:
        found = re.match(r"hmg(\d+)m", path.name)
        if found and not psutil.pid_exists(int(found.group(1))):
            path.unlink(missing_ok=True)
            removed.append(str(path))
    for path in Path(tempfile.gettempdir()).glob(_WORK_PREFIX + "*"):
        found = re.match(re.escape(_WORK_PREFIX) + r"(\d+)-", path.name)
        if found and not psutil.pid_exists(int(found.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


#: Seconds trainers that have finished may take to exit before the
#: launcher stops them (DGL's client shutdown can hang, dmlc/dgl#5300).
EXIT_GRACE_SECONDS = 30.0


def _watch(servers, workers, timeout, log, done=(),
           exit_grace: float = EXIT_GRACE_SECONDS) -> None:
    """Wait until every trainer has exited cleanly, or has finished
    (its ``done`` file exists) and still runs ``exit_grace`` seconds
    later: then it is stuck in DGL's shutdown and is stopped, the job
    counting as finished. `LaunchError` when a process dies, a server
    quits early or ``timeout`` passes."""
    began = time.monotonic()
    ended = finished = None
    everyone = servers + workers
    while True:
        for p in everyone:
            code = p.popen.poll()
            if code is None or code == 0 and p in servers:
                continue
            if code != 0:
                _stop(everyone)
                others = len([q for q in everyone if q is not p])
                raise LaunchError(
                    f"{p.label} {_describe(code)}; stopped the {others} "
                    "other processes"
                )
        if all(p.popen.poll() == 0 for p in workers):
            break
        if done and all(path.exists() for path in done):
            finished = finished or time.monotonic()
            if time.monotonic() - finished > exit_grace:
                stuck = [p for p in workers if p.popen.poll() is None]
                log(f"{', '.join(p.label for p in stuck)} finished but did "
                    f"not exit within {exit_grace:g} s (DGL's shutdown, "
                    "dmlc/dgl#5300); stopped them")
                _dump_stacks(stuck)
                _stop(everyone)
                return
        if any(p.popen.poll() == 0 for p in servers):
            # Servers stop when the trainers ask them to, at the very end;
            # trainers still running well after that are stuck.
            ended = ended or time.monotonic()
            if time.monotonic() - ended > 30:
                _stop(everyone)
                gone = next(p for p in servers if p.popen.poll() == 0)
                raise LaunchError(
                    f"{gone.label} exited while trainers were running; "
                    "stopped the others"
                )
        if timeout is not None and time.monotonic() - began > timeout:
            _dump_stacks(everyone)
            _stop(everyone)
            raise LaunchError(
                f"timed out after {timeout:g} s; stopped all "
                f"{len(everyone)} processes (the stacks of those still "
                "running are printed above)"
            )
        time.sleep(0.2)
    # The trainers asked the servers to shut down; give them a moment.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(
            p.popen.poll() is None for p in servers):
        time.sleep(0.2)
    for p in servers:
        if p.popen.poll() not in (0, None):
            log(f"{p.label} {_describe(p.popen.returncode)} at shutdown")
    log(f"all {len(everyone)} processes finished")
