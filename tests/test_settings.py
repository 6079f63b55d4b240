"""Settings declared once: the flags derived from them parse back to the
declared defaults, and a command's departures stay its own."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from hmgraph.cli import _build_parser
from hmgraph.settings import (
    SHARE_BUDGETS,
    TRAIN_CONCERNS,
    ClassifyConfig,
    TrainConfig,
    add_arguments,
    cli_names,
    flag_of,
    from_args,
)

#: (command, its config, the fields the command's flags depart from).
DERIVED = [
    pytest.param(["train"], TrainConfig,
                 {"out", "fanouts", "batch_size", "hidden", "dropout",
                  "input_dropout", "attn_dropout", "lr", "weight_decay",
                  "num_heads", "epochs"}, id="train"),
    pytest.param(["classify"], ClassifyConfig, {"out"}, id="classify"),
]


@pytest.mark.parametrize(("argv", "config", "departs"), DERIVED)
def test_flags_default_to_the_declared_values(argv, config, departs):
    args = _build_parser().parse_args(argv)
    values = from_args(config, args)
    declared = config()
    for name in cli_names(config):
        if name not in departs:
            assert values[name] == getattr(declared, name), name
    assert not {f.name for f in dataclasses.fields(config)} - set(values) \
        - {"eval_batch_size", "loader_only"}


def test_train_groups_cover_every_field_once():
    names = [name for concern in TRAIN_CONCERNS.values()
             for name in cli_names(concern)]
    assert len(names) == len(set(names))
    assert set(names) == set(cli_names(TrainConfig))


def test_a_switch_reads_back_negated():
    parser = argparse.ArgumentParser()
    add_arguments(parser, TrainConfig, ["verify", "progress", "renumber"])
    args = parser.parse_args(["--no-verify", "--renumber"])
    assert from_args(TrainConfig, args) == {"verify": False,
                                            "progress": True,
                                            "renumber": True}
    assert flag_of(TrainConfig.__dataclass_fields__["verify"]) == \
        "--no-verify"


def test_changes_name_declared_settings_only():
    with pytest.raises(ValueError, match="no such settings: nope"):
        add_arguments(argparse.ArgumentParser(), TrainConfig, ["seed"],
                      changes={"nope": {"default": 1}})


@pytest.mark.parametrize("command", ["bench", "train-dist"])
def test_share_budgets(command):
    extra = ["--parts-dir", "d"] if command == "train-dist" else []
    args = _build_parser().parse_args([command, *extra])
    assert args.device_budget == SHARE_BUDGETS["device_budget"]["default"]
    assert args.host_budget == SHARE_BUDGETS["host_budget"]["default"]
    assert args.epochs == 1
