"""Kept folds of ``hmgraph classify``: each finished fold's record in
``OUT/folds/fold-K.json`` with the settings and the `code_digest` that
made it, reused by ``--resume`` (another setting is refused).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from pathlib import Path

from hmgraph.cache.format import atomic_path
from hmgraph.checkpoint import CheckpointError, check_saved_settings

log = logging.getLogger(__name__)

__all__ = ["FOLD_KEYS", "code_digest", "fold_path", "keep_fold",
           "kept_fold"]

#: Settings a kept fold must share with the run that reuses it.
FOLD_KEYS = ("dataset", "model", "folds", "epochs", "patience", "batch_size",
             "hidden", "levels", "ratio", "dropout", "lr", "weight_decay",
             "seed", "device", "selection", "smooth", "inner_folds",
             "clip")


@functools.cache
def code_digest() -> str:
    """SHA-256 of hmgraph's Python sources (paths and bytes, in order):
    which code made a kept fold, with or without git."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def fold_path(config, fold: int) -> Path:
    """Where fold ``fold``'s record is kept."""
    return Path(config.out) / "folds" / f"fold-{fold}.json"


def kept_fold(config, fold: int) -> dict | None:
    """Fold ``fold``'s record from ``out/folds``, or None where there is
    none.

    Raises
    ------
    hmgraph.checkpoint.CheckpointError
        The file cannot be read or was made with another setting.
    """
    path = fold_path(config, fold)
    if not path.is_file():
        return None
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(
            f"fold record {path} cannot be read ({type(err).__name__}); "
            f"delete it or run without --resume") from None
    wrong = _wrong_fold_field(kept, fold)
    if wrong:
        raise CheckpointError(
            f"fold record {path} is not hmgraph's record of fold {fold} "
            f"({wrong}); delete it or run without --resume")
    settings, record = kept["config"], kept["record"]
    check_saved_settings(f"fold record {path}", settings, config, FOLD_KEYS)
    if kept.get("code") != code_digest():
        log.warning("fold record %s was made by other hmgraph code; "
                    "reused as it is", path)
    return record


#: Numbers a kept fold's record holds: what the summary, the table and
#: the grid's selection read.
_RECORD_NUMBERS = ("best_epoch", "epochs_run", "valid", "valid_loss", "test",
                   "seconds")


def _wrong_fold_field(kept, fold: int) -> str:
    """What is wrong with the shape of a kept fold's JSON ('' when
    nothing is)."""
    if not isinstance(kept, dict):
        return (f"it holds {'null' if kept is None else _json_kind(kept)}, "
                f"not an object")
    for key in ("config", "record"):
        if not isinstance(kept.get(key), dict):
            return f"its {key!r} is {_json_kind(kept.get(key))}, not an object"
    record = kept["record"]
    if record.get("fold") != fold:
        return f"its record is of fold {record.get('fold')!r}"
    for key in _RECORD_NUMBERS:
        value = record.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"its record's {key!r} is {_json_kind(value)}, not a number"
    return ""


def _json_kind(value) -> str:
    """``None`` -> ``"missing"``, ``[]`` -> ``"an array"``, ..."""
    if value is None:
        return "missing"
    kinds = {dict: "an object", list: "an array", str: "a string",
             bool: "a boolean"}
    return kinds.get(type(value), "a number")


def keep_fold(config, record: dict) -> None:
    """Keep a finished fold's ``record`` with the settings of
    `FOLD_KEYS` and the `code_digest`, atomically."""
    path = fold_path(config, record["fold"])
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps({
            "config": {k: getattr(config, k) for k in FOLD_KEYS},
            "code": code_digest(), "record": record}))


