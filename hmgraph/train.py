"""Node classification with mini-batch neighbour sampling.

`train` runs the whole job: for each run, epochs of sampled mini-batches
through `hmgraph.DataLoader`, full-neighbour layer-wise evaluation, best
validation model selection (the test metric reported is the one at the
epoch of best validation, as OGB's leaderboard asks), an atomic checkpoint
after every epoch, and a JSON result file.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import dgl
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from hmgraph import datasets
from hmgraph.cache.budget import parse_budget
from hmgraph.cache.format import atomic_path
from hmgraph.checkpoint import (
    CheckpointError,
    check_saved_settings,
    load_checkpoint,
    save_checkpoint,
)
from hmgraph.evaluation import (
    LAYERWISE_READ_LIMIT_SECONDS,
    describe_io,
    evaluate,
    layerwise_read_seconds,
    resolve_eval,
    summarize,
)
from hmgraph.layout import LAYOUTS, make_sampler, prepare, resolve_layout
from hmgraph.loader import DataLoader
from hmgraph.memory import (
    batch_input_bytes,
    batches_in_flight,
    check_model_memory,
    layerwise_buffer_bytes,
    memory_promise,
    peak_rss_bytes,
    prefetch_depth,
    size_memory,
    working_set_bytes,
)
from hmgraph.models import build_model
from hmgraph.models.layers import add_gcn_degrees
from hmgraph.settings import TrainConfig

log = logging.getLogger(__name__)

# Re-exported from the modules they moved to (issue 35): tests and bench
# scripts import them from here.
__all__ = ["LAYERWISE_READ_LIMIT_SECONDS", "LAYOUTS", "CheckpointError",
           "TrainConfig", "batch_input_bytes", "batches_in_flight",
           "check_model_memory", "check_saved_settings", "describe_io",
           "evaluate", "layerwise_buffer_bytes", "layerwise_read_seconds",
           "loader_only_epoch", "make_loader", "make_sampler",
           "memory_promise", "peak_rss_bytes", "prefetch_depth", "prepare",
           "resolve_eval", "resolve_layout", "summarize", "train",
           "working_set_bytes"]

def train(config: TrainConfig, dataset=None) -> dict:
    """Train and evaluate; write ``result.json`` under ``config.out``.

    Parameters
    ----------
    config : TrainConfig
        The settings.
    dataset : hmgraph.datasets.NodeDataset, optional
        Already loaded data; loaded from ``config`` when omitted.

    Returns
    -------
    dict
        The result: ``config``, ``dataset``, ``metric``, ``layout`` (the
        resolved name, its ``seconds``, whether the rewritten file was
        ``reused``, the feature file ``path``), ``runs`` (per run:
        per-epoch loss, metrics and seconds; best epoch; test metric at best
        validation), ``summary`` (mean and std over runs) and ``path``.
    """
    # (1) Settings checked before any loading.
    _check_settings(config)
    if dataset is None:
        dataset = datasets.load(config.dataset, config.root, config.verify,
                                features_on=config.features_on,
                                progress=config.progress)
    check_model_memory(lambda: _build_model(config, dataset), config.device,
                       _model_sizes(config))
    # (2) The checkpoint to resume, the layout, the sampler, the loader.
    out = Path(config.out)
    checkpoint_path = out / "checkpoint.pt"
    state = load_checkpoint(checkpoint_path, config, TrainConfig()) \
        if config.resume else None
    completed = state["completed"] if state else []
    device = torch.device(config.device)
    dataset, sampler, layout, profile = prepare(config, dataset)
    if config.model == "gcn":
        # The graph's degrees, for every block's GCN normalisation.
        add_gcn_degrees(dataset.graph)
    log.info("%s", dataset)
    loader, memory = make_loader(config, dataset, sampler, device, profile)
    try:  # once every setting fitted
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OSError(err.errno, f"--out {out}: cannot make the folder: "
                      f"{err.strerror}") from None
    # (3) How to evaluate, once the loader's plan is known.
    eval_mode = resolve_eval(config, dataset, loader)
    log.info("evaluation: %s", eval_mode)
    metric = dataset.evaluator.eval_metric
    # (4) The runs not finished yet.
    try:
        for run in range(len(completed), config.runs):
            record = _train_run(config, dataset, loader, run, state, device,
                                checkpoint_path, completed, eval_mode)
            completed.append(record)
            state = None
        loader_only = loader_only_epoch(config, loader) \
            if config.loader_only else None
    finally:
        loader.close()
    # (5) The result, written atomically.
    peak = peak_rss_bytes()
    result = {
        "config": config.as_dict(),
        "dataset": repr(dataset),
        "metric": metric,
        "plan": next(iter(loader.plan.values())).as_dict(),
        "eval": eval_mode,
        "layout": layout,
        "memory": dict(memory, peak_rss_bytes=peak,
                       within_promise=peak <= memory["promise_bytes"]),
        "runs": completed,
        "summary": summarize(completed),
    }
    if loader_only is not None:
        result["loader_only"] = loader_only
    return _write_result(result, out / "result.json")


def _check_settings(config) -> None:
    """Refuse a bad ``eval``, layout or budget before any loading."""
    if config.eval not in ("auto", "layerwise", "sampled"):
        raise ValueError(f"eval must be auto, layerwise or sampled, got "
                         f"{config.eval!r}")
    resolve_layout(config)
    for name in ("device_budget", "host_budget"):
        text = getattr(config, name)
        if text != "auto":
            try:
                parse_budget(text, 1)
            except ValueError as err:
                raise ValueError(f"{name.replace('_', ' ')}: {err}") from None


def _write_result(result: dict, path: Path) -> dict:
    """``result`` as JSON at ``path``, atomically; ``path`` set in it."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(result, indent=1))
    result["path"] = str(path)
    return result


def make_loader(config, dataset, sampler, device, profile=None):
    """The training loader with the cache and feature source asked for.

    ``profile`` (a `hmgraph.samplers.presample.Profile` of the loader's own
    batches) spares the loader its profiling pass.

    Returns the loader and a record of the memory it was sized with:
    graph bytes, feature bytes, working set and the budgets in bytes.
    """
    memory = size_memory(config, dataset, sampler, device)
    features = dataset.feature_path if config.features_on == "disk" \
        else dataset.features
    loader = DataLoader(
        dataset.graph, dataset.split["train"], sampler, features=features,
        labels=dataset.labels, batch_size=config.batch_size, shuffle=True,
        device=device, seed=config.seed, cache=config.cache,
        device_budget_bytes=memory["device_budget_bytes"],
        host_budget_bytes=memory["host_budget_bytes"],
        prefetch=prefetch_depth(config), window=config.window,
        profile_batches=config.profile_batches, reuse=config.reuse,
        placement=config.placement, profile=profile,
    )
    return loader, memory


def _train_run(config, dataset, loader, run, state, device, checkpoint_path,
               completed, eval_mode) -> dict:
    seed = config.seed + 1000 * run
    torch.manual_seed(seed)
    model = _build_model(config, dataset).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr,
                                 weight_decay=config.weight_decay)
    record = {"run": run, "epochs": [], "best_epoch": -1,
              "best_valid": -math.inf, "test_at_best_valid": 0.0}
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        record = state["record"]
    for epoch in range(len(record["epochs"]), config.epochs):
        entry = _train_epoch(config, model, optimizer, loader, run, epoch)
        if (epoch + 1) % config.eval_every == 0 or epoch + 1 == config.epochs:
            start = time.perf_counter()
            scores = evaluate(config, dataset, model, loader, device,
                              eval_mode)
            entry.update({"train": entry["train_running"], **scores})
            entry["seconds"]["eval"] = time.perf_counter() - start
            if entry["valid"] > record["best_valid"]:
                record.update(best_epoch=epoch, best_valid=entry["valid"],
                              test_at_best_valid=entry["test"])
            log.info(
                "run %d epoch %d: loss %.4f train %.4f valid %.4f test %.4f",
                run, epoch, entry["loss"], entry["train"], entry["valid"],
                entry["test"],
            )
        record["epochs"].append(entry)
        save_checkpoint(checkpoint_path, config, model, optimizer, record,
                         completed)
    return record


def _build_model(config, dataset) -> torch.nn.Module:
    return build_model(
        config.model, dataset.feat_dim, config.hidden, dataset.num_classes,
        num_layers=config.layers, dropout=config.dropout,
        num_heads=config.num_heads, input_dropout=config.input_dropout,
        attn_dropout=config.attn_dropout,
    )


def _model_sizes(config) -> dict:
    """The flags that size the model, for `check_model_memory`."""
    sizes = {"--hidden": config.hidden}
    if config.model == "gat":
        sizes["--num-heads"] = config.num_heads
    return sizes


def loader_only_epoch(config, loader) -> dict:
    """One epoch of ``loader`` alone, seeded as the first training epoch:
    ``batches``, ``epoch_seconds``, ``seconds_per_batch``, the loader's
    stage ``seconds`` and ``cpu_seconds`` of the process."""
    dgl.seed(config.seed)
    loader.set_epoch(0)
    loader.stats.reset()
    batches = 0
    cpu = time.process_time()
    start = time.perf_counter()
    for _ in loader:
        batches += 1
    epoch = time.perf_counter() - start
    return {"batches": batches, "epoch_seconds": epoch,
            "seconds_per_batch": epoch / max(batches, 1),
            "cpu_seconds": time.process_time() - cpu,
            "seconds": dict(loader.stats.seconds)}


def _train_epoch(config, model, optimizer, loader, run, epoch) -> dict:
    torch.manual_seed(config.seed + 1000 * run + epoch)
    dgl.seed(config.seed + 1000 * run + epoch)  # the sampled neighbours
    loader.set_epoch(epoch + 1000 * run)
    loader.stats.reset()
    model.train()
    total_loss, total_seeds, train_seconds = 0.0, 0, 0.0
    total_correct = 0
    start = time.perf_counter()
    batches = tqdm(loader, desc=f"run {run} epoch {epoch}", leave=False,
                   disable=not config.progress)
    for batch in batches:
        step = time.perf_counter()
        logits = model(batch.blocks, batch.x)
        loss = F.cross_entropy(logits, batch.y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        train_seconds += time.perf_counter() - step
        n = batch.y.numel()
        total_loss += float(loss) * n
        total_correct += int((logits.argmax(dim=-1) == batch.y).sum())
        total_seeds += n
        batches.set_postfix(loss=f"{float(loss):.3f}")
    seconds = dict(loader.stats.seconds)
    seconds["train"] = train_seconds
    seconds["epoch"] = time.perf_counter() - start
    stats = loader.stats.as_dict()
    if any(p.policy != "none" for p in loader.plan.values()) \
            or loader.stats.storage is not None \
            or loader.stats.reuse is not None:
        log.info("run %d epoch %d: %s", run, epoch, describe_io(stats))
    return {"epoch": epoch, "loss": total_loss / max(total_seeds, 1),
            "train_running": total_correct / max(total_seeds, 1),
            "seconds": seconds, "loader": stats}

