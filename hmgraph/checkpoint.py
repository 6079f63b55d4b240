"""Checkpoints of node classification: saved atomically after every
epoch, refused on resume when a setting that shaped them differs.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from hmgraph.cache.format import atomic_path

log = logging.getLogger(__name__)

__all__ = ["CHECKPOINT_KEYS", "CheckpointError", "check_saved_settings",
           "load_checkpoint", "save_checkpoint"]

#: Settings a checkpoint must share with the run that resumes it.
CHECKPOINT_KEYS = (
    "dataset", "model", "fanouts", "batch_size", "hidden", "layers",
    "dropout", "input_dropout", "attn_dropout", "lr", "weight_decay",
    "num_heads", "seed", "sampler",
    "clusters", "locality", "group_size", "renumber", "layout",
)


class CheckpointError(ValueError):
    """A checkpoint cannot be resumed; the message says which setting."""



def save_checkpoint(path, config, model, optimizer, record,
                    completed) -> None:
    """Write ``path`` atomically: the settings of `CHECKPOINT_KEYS`, the
    model's and optimizer's state, the run's record so far and the runs
    ``completed``."""
    state = {
        "config": {k: getattr(config, k) for k in CHECKPOINT_KEYS},
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "record": record,
        "completed": completed,
    }
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def check_saved_settings(what: str, saved: dict, config, keys,
                         defaults=None) -> None:
    """Refuse saved work whose settings differ from this run's.

    Parameters
    ----------
    what : str
        What was saved, for the message, e.g. ``"checkpoint out/ckpt.pt"``.
    saved : dict
        The settings the saved work was made with.
    config : object
        This run's settings, read by attribute.
    keys : sequence of str
        The settings that must agree.
    defaults : object, optional
        Values for keys ``saved`` lacks (settings newer than the file);
        without it a missing key reads as None.

    Raises
    ------
    CheckpointError
        Naming the first key that differs, both values, and the way out.
    """
    for key in keys:
        value = saved.get(key, getattr(defaults, key, None))
        if value != getattr(config, key):
            raise CheckpointError(
                f"{what} was written with {key}={value!r}, but this run has "
                f"{key}={getattr(config, key)!r}; use the same setting or "
                f"another --out")


def load_checkpoint(path: Path, config, defaults):
    """The state saved at ``path`` for ``config`` to resume, or None where
    there is none.

    Parameters
    ----------
    path : pathlib.Path
        The checkpoint file.
    config : TrainConfig
        This run's settings.
    defaults : TrainConfig
        The values of settings newer than the checkpoint.

    Raises
    ------
    CheckpointError
        The file cannot be read, was written with another setting, or
        holds more epochs or runs than ``config`` asks for.
    """
    if not path.is_file():
        log.info("no checkpoint at %s; starting afresh", path)
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({type(err).__name__}); "
            f"delete it or train without --resume"
        ) from None
    # A setting newer than the checkpoint: it ran with the default.
    check_saved_settings(f"checkpoint {path}", state.get("config", {}),
                         config, CHECKPOINT_KEYS, defaults=defaults)
    done = len(state["record"]["epochs"]) if state.get("record") else 0
    done = max([done] + [len(r["epochs"]) for r in state["completed"]])
    if done > config.epochs or len(state["completed"]) > config.runs:
        raise CheckpointError(
            f"checkpoint {path} already holds {done} epoch(s) and "
            f"{len(state['completed'])} finished run(s), more than --epochs "
            f"{config.epochs} --runs {config.runs}: raise them or use "
            f"another --out")
    return state
