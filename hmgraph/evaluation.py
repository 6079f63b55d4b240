"""Evaluation of node classification: layer-wise or sampled inference,
the choice between them, and the summary over runs.
"""

from __future__ import annotations

import math
from pathlib import Path

import dgl
import torch

from hmgraph.cache.budget import (
    HOST_RESERVE_BYTES,
    available_bytes,
    format_bytes,
)
from hmgraph.cache.coordinated import FrozenView
from hmgraph.cache.disk import disk_model
from hmgraph.loader import DataLoader
from hmgraph.memory import (
    layerwise_buffer_bytes,
    layerwise_on_disk,
    prefetch_depth,
)
from hmgraph.models import layerwise_inference

__all__ = ["LAYERWISE_READ_LIMIT_SECONDS", "describe_io", "evaluate",
           "layerwise_read_seconds", "layerwise_scratch", "resolve_eval",
           "summarize"]


#: ``eval="auto"`` picks layer-wise inference while the disk model prices
#: its estimated storage reads under this many seconds.
LAYERWISE_READ_LIMIT_SECONDS = 60.0


def layerwise_read_seconds(config, dataset, loader) -> float:
    """The disk model's seconds for layer-wise inference's storage reads.

    Layer-wise inference reads each chunk's input rows that the cache
    does not hold; a chunk's inputs (the chunk and its neighbours, random
    ids) spread over nearly every page, so each chunk reads about every
    uncached byte, in requests that each cover a break-even gap
    (`hmgraph.cache.disk.DiskModel.gap_bytes`) or a row. Priced with the
    model of the feature file's disk at the depth the storage tier keeps
    in flight.
    """
    (plan,) = loader.plan.values()  # the one node type's
    held = plan.held_rows
    row_bytes = dataset.manifest.row_bytes
    uncached = max(0, dataset.num_nodes - held) * row_bytes
    chunks = math.ceil(dataset.num_nodes / config.eval_batch_size)
    model = disk_model(dataset.feature_path)
    requests = uncached / max(model.gap_bytes, row_bytes)
    return chunks * model.seconds(requests, uncached)


def resolve_eval(config, dataset, loader) -> str:
    """``layerwise`` or ``sampled``, resolving ``auto``.

    With features on disk, ``auto`` keeps layer-wise while its storage
    reads (`layerwise_read_seconds`) stay under
    `LAYERWISE_READ_LIMIT_SECONDS` and its buffers
    (`layerwise_buffer_bytes`) fit in free memory.
    """
    if config.eval != "auto":
        return config.eval
    if config.features_on == "memory":
        return "layerwise"
    fits = layerwise_buffer_bytes(config, dataset) + HOST_RESERVE_BYTES <= \
        available_bytes("cpu")
    return "layerwise" if fits and layerwise_read_seconds(
        config, dataset, loader) <= LAYERWISE_READ_LIMIT_SECONDS \
        else "sampled"



def layerwise_scratch(config, dataset) -> Path | None:
    """Where layer-wise inference writes its hidden layers: the run's
    folder where `hmgraph.memory.layerwise_on_disk` (``eval="layerwise"``
    asked for; ``auto`` samples there), else None: in memory."""
    if not layerwise_on_disk(config, dataset):
        return None
    folder = Path(config.out)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def evaluate(config, dataset, model, loader, device, mode: str) -> dict:
    """Metric per split: ``valid`` and ``test`` (and ``train`` layer-wise).

    Layer-wise inference reads rows in node-id order, chunk by chunk: from
    memory, or through a `FrozenView` of the training cache (hits from its
    tiers, misses from storage, nothing admitted). Sampled inference runs
    DGL's ``NeighborSampler`` with the training fanouts over each split
    through the same view.
    """
    (cache,) = loader.cache.values()  # the one node type's
    view = FrozenView(cache)
    if mode == "layerwise":
        features = dataset.features if config.features_on == "memory" \
            else view
        logits = layerwise_inference(
            model, dataset.graph, features, device,
            batch_size=config.eval_batch_size,
            scratch=layerwise_scratch(config, dataset),
        )
        return {split: dataset.evaluate(logits, split)
                for split in ("train", "valid", "test")}
    fanouts = [0] * config.layers if config.model == "mlp" \
        else config.fanouts
    sampler = dgl.dataloading.NeighborSampler(fanouts, fused=False) \
        if config.model == "mlp" else dgl.dataloading.NeighborSampler(fanouts)
    scores = {}
    was_training = model.training
    model.eval()
    try:
        for split in ("valid", "test"):
            ids = dataset.split[split]
            split_loader = DataLoader(
                dataset.graph, ids, sampler, features=view,
                labels=dataset.labels, batch_size=config.batch_size,
                device=device, seed=config.seed,
                prefetch=prefetch_depth(config),
            )
            parts = []
            dgl.seed(config.seed)  # the same sampled neighbours every time
            with torch.no_grad():
                for batch in split_loader:
                    parts.append(model(batch.blocks, batch.x).cpu())
            split_loader.close()
            scores[split] = dataset.score(torch.cat(parts), split)
    finally:
        model.train(was_training)
    return scores


def describe_io(stats: dict) -> str:
    """One line of cache hits and I/O from `LoaderStats.as_dict`."""
    cache = stats.get("cache", {})
    rates = ", ".join(f"{tier} {rate:.1%}" for tier, rate in
                      cache.get("hit_rate", {}).items())
    text = f"rows from {rates}"
    link = cache.get("bytes", {}).get("host->device", 0)
    text += f"; host->device {format_bytes(link)}"
    reuse = stats.get("reuse")
    if reuse:
        text += (f"; reused {reuse['reuse_rate']:.1%} of rows, "
                 f"{format_bytes(reuse['bytes_saved'])} saved")
    storage = stats.get("storage")
    if storage:
        text += (f"; storage {storage['io_requests']} requests, "
                 f"{format_bytes(storage['bytes_read'])} "
                 f"(amplification {storage['amplification']:.2f}), "
                 f"{storage['seconds']:.1f} s (disk model "
                 f"{storage['model_seconds']:.1f} s)")
    return text


def summarize(records: list[dict]) -> dict:
    """Mean and standard deviation over runs, as OGB's leaderboard reports.

    Returns
    -------
    dict
        ``valid_mean``, ``valid_std``, ``test_mean``, ``test_std`` of the
        best-validation epoch of every run; 0.0 for an empty list.
    """
    if not records:
        return {"valid_mean": 0.0, "valid_std": 0.0,
                "test_mean": 0.0, "test_std": 0.0, "runs": 0}
    valid = torch.tensor([r["best_valid"] for r in records],
                         dtype=torch.float64)
    test = torch.tensor([r["test_at_best_valid"] for r in records],
                        dtype=torch.float64)
    std = (0.0, 0.0) if len(records) == 1 else (float(valid.std()),
                                                float(test.std()))
    return {"valid_mean": float(valid.mean()), "valid_std": std[0],
            "test_mean": float(test.mean()), "test_std": std[1],
            "runs": len(records)}
