"""Where a result comes from and where it goes.

`commit` and `environment` (with `environment_text` and `disk_text`, its
sentences) record what produced a result; `write_results` writes it as
JSON with its markdown beside, and `finish` prints it too.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from functools import cache
from pathlib import Path

import numpy as np
import torch

import hmgraph
from hmgraph.cache.disk import DiskModel
from hmgraph.cache.format import atomic_path

__all__ = [
    "commit",
    "disk_text",
    "environment",
    "environment_text",
    "finish",
    "merged_commit",
    "parts_by_commit",
    "write_results",
]


@cache
def commit() -> dict:
    """The commit of this checkout (``git rev-parse HEAD``) and ``dirty``:
    whether tracked or untracked files differ from it, results folders
    left out. Taken once per process; None where git cannot tell."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=root, text=True,
                                  capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--", ".",
                 ":(exclude)bench/results") if sha else None
    return {"sha": sha, "dirty": None if status is None else bool(status)}


def merged_commit(commits) -> dict:
    """The commit of a result put together from parts run by ``commits``
    (`commit` dicts, None for a part that recorded none): the one they
    all share, else ``{"sha": None, "dirty": None, "merged": [...]}``
    naming each known one once, in order (a part with none is not
    claimed for any); this checkout's `commit` where none is known."""
    commits = list(commits)
    unique = []
    for found in commits:
        if found and found not in unique:
            unique.append(found)
    if not unique:
        return commit()
    return unique[0] if len(unique) == 1 and all(commits) else {
        "sha": None, "dirty": None, "merged": unique}


def parts_by_commit(result: dict, parts, name) -> list[str]:
    """Markdown lines naming which of ``parts`` (records with a
    ``commit``) each commit of ``result``'s ``merged`` ran: ``name(part)``
    of each, once, in order; none where one commit ran them all."""
    lines = []
    for found in (result.get("commit") or {}).get("merged", []):
        names = dict.fromkeys(name(p) for p in parts
                              if p.get("commit") == found)
        lines += [f"Cells of {', '.join(names)} by commit `{found['sha']}`"
                  + (" with uncommitted changes" if found["dirty"] else "")
                  + ".", ""]
    return lines


def environment() -> dict:
    """Versions, CPUs, threads and the machine's load right now."""
    import dgl  # lazy: 4 s to import

    return {"hmgraph": hmgraph.__version__, "torch": torch.__version__,
            "dgl": dgl.__version__, "numpy": np.__version__,
            "python": platform.python_version(),
            "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "torch_num_threads": torch.get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "loadavg": os.getloadavg()}


def environment_text(env: dict) -> str:
    """`environment` in one clause of a setup line."""
    return (f"torch {env['torch']}, dgl {env['dgl']}, "
            f"{env['torch_num_threads']} threads, {env['cpu_count']} CPUs, "
            f"load average {env['loadavg'][0]:.1f} at the start")


def disk_text(model: dict, sweep: bool = False) -> str:
    """`hmgraph.cache.disk.DiskModel.describe` of its ``as_dict``; with
    ``sweep``, and its reads/s per queue depth where it has them."""
    model = DiskModel(**{k: v for k, v in model.items()
                         if k != "gap_bytes"})
    text = model.describe()
    if sweep and model.sweep:
        text += (f"; random 4 KiB reads/s per queue depth "
                 f"{model.describe_sweep()}")
    return text


def write_results(result: dict, markdown: str, path) -> Path:
    """Write ``result`` to ``path`` (JSON) and ``markdown`` beside it
    (``.md``), each atomically, both naming the commit that wrote them.

    ``result["commit"]`` is set to `commit` unless present; the markdown's
    second line names it (or each of ``merged``, for a result put together
    from runs of several commits). Returns the JSON's path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    result.setdefault("commit", commit())
    sha, dirty = result["commit"]["sha"], result["commit"]["dirty"]
    merged = [c["sha"] for c in result["commit"].get("merged", [])]
    line = (f"Written by commit `{sha}`"
            + (" with uncommitted changes" if dirty else "") + "."
            if sha else "Written by commits " + ", ".join(
                f"`{c}`" for c in merged) + " (the parts are named below)."
            if merged else
            "Commit unknown (not recorded, or no git checkout).")
    head, _, rest = markdown.partition("\n")
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(result, indent=1) + "\n")
    with atomic_path(path.with_suffix(".md")) as tmp:
        tmp.write_text(f"{head}\n\n{line}\n{rest}")
    return path


def finish(result: dict, markdown: str, out) -> int:
    """Write the results (`write_results`), print the markdown; 0."""
    path = write_results(result, markdown, out)
    print(markdown, end="" if markdown.endswith("\n") else "\n")
    print(f"wrote {path}", file=sys.stderr)
    return 0
