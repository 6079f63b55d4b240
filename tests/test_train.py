"""Training: results, best-validation selection, checkpoints, accuracy."""

from __future__ import annotations

import json

import pytest
import torch

from hmgraph import datasets
from hmgraph.train import CheckpointError, TrainConfig, summarize, train


def config(tmp_path, **overrides) -> TrainConfig:
    settings = dict(dataset="synth-tiny", fanouts=[5, 5], batch_size=256,
                    hidden=64, lr=0.01, epochs=2, out=str(tmp_path / "out"),
                    progress=False)
    settings.update(overrides)
    return TrainConfig(**settings)


def test_result_file(tiny, tmp_path):
    result = train(config(tmp_path, runs=2), dataset=tiny)
    on_disk = json.loads((tmp_path / "out" / "result.json").read_text())
    assert on_disk["summary"] == result["summary"]
    assert on_disk["config"]["fanouts"] == [5, 5]
    assert result["metric"] == "acc" and len(result["runs"]) == 2
    for record in result["runs"]:
        assert [e["epoch"] for e in record["epochs"]] == [0, 1]
        best = max(record["epochs"], key=lambda e: e["valid"])
        assert record["best_valid"] == best["valid"]
        assert record["test_at_best_valid"] == best["test"]
        for entry in record["epochs"]:
            assert set(entry["seconds"]) >= {"sample", "fetch", "wait",
                                              "train", "eval", "epoch"}
            assert 0.0 <= entry["test"] <= 1.0
    summary = result["summary"]
    tests = [r["test_at_best_valid"] for r in result["runs"]]
    assert summary["test_mean"] == pytest.approx(sum(tests) / 2)
    assert summary["test_std"] == pytest.approx(
        float(torch.tensor(tests, dtype=torch.float64).std()))


def test_gnn_beats_mlp(tiny, tmp_path):
    scores = {}
    for model in ("sage", "mlp"):
        result = train(config(tmp_path / model, model=model, epochs=10),
                       dataset=tiny)
        scores[model] = result["summary"]["test_mean"]
    assert scores["sage"] > scores["mlp"] + 0.1, scores


def test_resume_continues(tiny, tmp_path):
    first = train(config(tmp_path, epochs=2), dataset=tiny)
    resumed = train(config(tmp_path, epochs=3, resume=True), dataset=tiny)
    old, new = first["runs"][0]["epochs"], resumed["runs"][0]["epochs"]
    assert len(new) == 3
    assert new[:2] == old  # the first two epochs come from the checkpoint
    # Resuming a finished job trains nothing more.
    again = train(config(tmp_path, epochs=3, resume=True), dataset=tiny)
    assert again["runs"] == resumed["runs"]
    # Fewer epochs than the checkpoint holds: refused, not misreported.
    with pytest.raises(CheckpointError, match=r"already holds 3 epoch\(s\) "
                       r"and 0 finished run\(s\), more than --epochs 2"):
        train(config(tmp_path, epochs=2, resume=True), dataset=tiny)


def test_resume_refuses_other_settings(tiny, tmp_path):
    train(config(tmp_path, epochs=1), dataset=tiny)
    with pytest.raises(CheckpointError, match="lr=0.01, but this run has "
                       "lr=0.02"):
        train(config(tmp_path, epochs=2, lr=0.02, resume=True), dataset=tiny)


class _Payload:
    def __reduce__(self):
        return (print, ("this checkpoint runs code",))


def test_resume_never_unpickles_objects(tiny, tmp_path):
    (tmp_path / "out").mkdir()
    torch.save({"config": _Payload()}, tmp_path / "out" / "checkpoint.pt")
    with pytest.raises(CheckpointError, match="cannot be read"):
        train(config(tmp_path, resume=True), dataset=tiny)


def test_summarize_empty():
    assert summarize([])["test_mean"] == 0.0


def test_graphsage_on_cora(shared_data, tmp_path):
    """GraphSAGE with the public split: mean test accuracy over 3 runs of
    at least 0.78 (one run varies by about a point)."""
    cora = datasets.load("cora", shared_data)
    result = train(config(tmp_path, dataset="cora", fanouts=[-1, -1],
                          batch_size=140, hidden=64, lr=0.01,
                          weight_decay=5e-4, epochs=100, runs=3),
                   dataset=cora)
    assert result["summary"]["test_mean"] >= 0.78
