"""Baseline: DGL's own mini-batch loop with features in memory.

Every later hmgraph benchmark is compared with this one. For each dataset
it trains a GNN for ``--epochs`` epochs over the train split with
`dgl.dataloading.DataLoader` and `dgl.dataloading.NeighborSampler` (shuffle,
``num_workers=0``, CPU), reading node features and labels from the
in-memory tensors ``graph.ndata["feat"]`` / ``graph.ndata["label"]``, and
splits each epoch's seconds into

* **sample**: time in ``next()`` of DGL's loader iterator (built without
  ``prefetch_node_feats``, so that is sampling only),
* **fetch**: ``feat[input_nodes]`` and ``label[output_nodes]``,
* **train**: forward, cross-entropy loss, backward and optimizer step.

Before the first epoch the graph's sparse formats (COO, CSR, CSC) are
built once with ``graph.create_formats_()`` and timed apart
(``prepare_seconds``), so the first batch's sample time does not include
DGL's one-off conversion, and a loader run later in the same process on
the same graph starts from the same state.

It also records batches, input nodes per batch, rows and bytes fetched,
peak resident memory (``ru_maxrss``, process-wide, so it includes loading
the dataset and any dataset benchmarked before), dataset sizes, versions,
thread count and the configuration.

Output: ``--out`` (default ``bench/results/baseline.json``), a JSON list
with one record per dataset, rewritten atomically after each dataset, and
a markdown table next to it with the same stem (``baseline.md``), which is
also printed at the end.

Times are only comparable within one machine and load; compare later
benchmarks as ratios against a baseline taken in the same invocation.

Examples
--------
From the repository root::

    python bench/baseline.py --datasets synth-small,synth-products \\
        --root data
    python bench/baseline.py --datasets synth-tiny --epochs 2 \\
        --fanouts 10,5 --out /tmp/baseline.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

# DGL's OpenMP runtime and torch's spin against each other on few cores;
# passive waiting keeps them from doing so. Must precede torch's import.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import dgl  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tqdm import tqdm  # noqa: E402

from hmgraph import datasets  # noqa: E402
from hmgraph.cache.format import atomic_path  # noqa: E402
from hmgraph.models import MODELS, build_model  # noqa: E402

SEED = 0
DROPOUT = 0.5
LR = 0.003
DEFAULT_DATASETS = "synth-small,synth-products"
DEFAULT_OUT = "bench/results/baseline.json"

TABLE_COLUMNS = (
    "dataset", "nodes", "edges", "batches", "epoch s", "sample s",
    "fetch s", "train s", "sample %", "fetch %", "train %",
    "input nodes/batch", "peak RSS MB",
)


class UsageError(ValueError):
    """A command-line value is unusable; the message says which and why."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and validate the command line.

    Parameters
    ----------
    argv : list of str, optional
        Arguments without the program name. Default: ``sys.argv[1:]``.

    Returns
    -------
    argparse.Namespace
        With ``datasets`` and ``fanouts`` as lists.

    Raises
    ------
    UsageError
        A value is out of range, a dataset or model unknown, or the root
        missing.
    """
    parser = argparse.ArgumentParser(
        description="Baseline: DGL DataLoader + NeighborSampler, features "
        "in memory; seconds split into sample / fetch / train.",
    )
    parser.add_argument("--datasets", default=DEFAULT_DATASETS,
                        help="comma-separated dataset names "
                        f"(default: {DEFAULT_DATASETS})")
    parser.add_argument("--root", default="data",
                        help="folder holding the datasets (default: data)")
    parser.add_argument("--fanouts", default="15,10,5",
                        help="neighbours per layer, input layer first as in "
                        "DGL (default: 15,10,5)")
    parser.add_argument("--batch-size", type=int, default=1024,
                        help="seed nodes per batch (default: 1024)")
    parser.add_argument("--epochs", type=int, default=1,
                        help="epochs per dataset (default: 1)")
    parser.add_argument("--model", default="sage",
                        help=f"one of {', '.join(sorted(MODELS))} "
                        "(default: sage)")
    parser.add_argument("--hidden", type=int, default=256,
                        help="hidden feature size (default: 256)")
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help=f"JSON result file (default: {DEFAULT_OUT}); "
                        "the markdown table goes next to it")
    args = parser.parse_args(argv)

    args.datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    if not args.datasets:
        raise UsageError("--datasets is empty")
    known = datasets.known_datasets()
    for name in args.datasets:
        if name not in known:
            raise UsageError(
                f"unknown dataset {name!r}; known: {', '.join(known)}"
            )
    args.fanouts = parse_fanouts(args.fanouts)
    for flag, value in [("--batch-size", args.batch_size),
                        ("--epochs", args.epochs),
                        ("--hidden", args.hidden)]:
        if value < 1:
            raise UsageError(f"{flag} must be a positive int; got {value}")
    if args.model not in MODELS:
        raise UsageError(
            f"unknown model {args.model!r}; available: "
            f"{', '.join(sorted(MODELS))}"
        )
    if not Path(args.root).is_dir():
        raise UsageError(
            f"dataset root {args.root!r} does not exist; pass an existing "
            f"--root"
        )
    if Path(args.out).suffix != ".json":
        raise UsageError(f"--out must end in .json; got {args.out!r}")
    return args


def parse_fanouts(text: str) -> list[int]:
    """Parse ``"15,10,5"`` into ``[15, 10, 5]``.

    Parameters
    ----------
    text : str
        Comma-separated positive ints, one per layer, input layer first
        as in `dgl.dataloading.NeighborSampler` (``-1``: all neighbours).

    Returns
    -------
    list of int

    Raises
    ------
    UsageError
        If a part is not an int, is 0 or below -1, or there is none.
    """
    try:
        fanouts = [int(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(
            f"--fanouts must be comma-separated ints such as 15,10,5; "
            f"got {text!r}"
        ) from None
    if not fanouts or any(f == 0 or f < -1 for f in fanouts):
        raise UsageError(
            f"--fanouts must be positive ints (or -1 for all neighbours); "
            f"got {text!r}"
        )
    return fanouts


def rss_mb() -> float:
    """Current resident memory of this process, in MB (2**20 bytes)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB (2**20 bytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_epoch(loader, model, optimizer, feat, label, epoch, desc) -> dict:
    """Train one epoch and time its stages.

    Parameters
    ----------
    loader : dgl.dataloading.DataLoader
        Yields ``(input_nodes, output_nodes, blocks)`` on the CPU.
    model : torch.nn.Module
        Called as ``model(blocks, x)``.
    optimizer : torch.optim.Optimizer
    feat, label : torch.Tensor
        In-memory node features (float rows) and labels (int64), CPU.
    epoch : int
        Epoch index, for the progress bar.
    desc : str
        Progress bar label.

    Returns
    -------
    dict
        ``seconds`` (``epoch``, ``sample``, ``fetch``, ``train``),
        ``batches``, ``input_rows``, ``output_rows``, ``mean_loss`` and
        ``first_sample_seconds`` (the first ``next()``).
    """
    model.train()
    sample = fetch = train = 0.0
    first_sample = None
    batches = input_rows = output_rows = 0
    loss_sum = 0.0
    bar = tqdm(total=len(loader), desc=f"{desc} epoch {epoch}",
               unit="batch", mininterval=2.0, file=sys.stderr)
    start = time.perf_counter()
    it = iter(loader)
    while True:
        # (1) sample: DGL's iterator draws seeds and samples blocks.
        t0 = time.perf_counter()
        try:
            input_nodes, output_nodes, blocks = next(it)
        except StopIteration:
            sample += time.perf_counter() - t0
            break
        t1 = time.perf_counter()
        # (2) fetch: index the in-memory feature and label tensors.
        x = feat[input_nodes]
        y = label[output_nodes]
        t2 = time.perf_counter()
        # (3) train: forward, loss, backward, step.
        logits = model(blocks, x)
        loss = F.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        t3 = time.perf_counter()

        if first_sample is None:
            first_sample = t1 - t0
        sample += t1 - t0
        fetch += t2 - t1
        train += t3 - t2
        batches += 1
        input_rows += int(input_nodes.numel())
        output_rows += int(output_nodes.numel())
        loss_sum += float(loss)
        bar.update(1)
    epoch_seconds = time.perf_counter() - start
    bar.close()
    return {
        "seconds": {"epoch": epoch_seconds, "sample": sample,
                    "fetch": fetch, "train": train},
        "first_sample_seconds": first_sample or 0.0,
        "batches": batches,
        "input_rows": input_rows,
        "output_rows": output_rows,
        "mean_loss": loss_sum / batches if batches else 0.0,
    }


def load_dataset(name: str, root: str) -> tuple[object, float]:
    """Load a dataset with `hmgraph.datasets.load`, timed.

    The feature file's checksum is not recomputed: this benchmark reads
    the features from memory, never from the file.

    Returns
    -------
    tuple of (NodeDataset, float)
        The dataset and the seconds its loading took.

    Raises
    ------
    ValueError
        hmgraph's `DatasetError` (unknown name, missing data) and the like.
    """
    t0 = time.perf_counter()
    dataset = datasets.load(name, root, verify=False)
    return dataset, time.perf_counter() - t0


def bench_dataset(dataset, load_seconds: float,
                  args: argparse.Namespace) -> dict:
    """Run the baseline on one loaded dataset.

    Parameters
    ----------
    dataset : hmgraph.datasets.NodeDataset
        From `load_dataset`.
    load_seconds : float
        Seconds loading took, recorded as is.
    args : argparse.Namespace
        Parsed command line (see `parse_args`).

    Returns
    -------
    dict
        One JSON-ready record; times in seconds, memory in MB
        (2**20 bytes), bytes in bytes. Per-epoch figures are means over
        the epochs; ``epochs`` holds each epoch's own.
    """
    # (1) The in-memory graph, features, labels and train seeds.
    name = dataset.name
    graph = dataset.graph
    feat = graph.ndata["feat"]
    label = graph.ndata["label"]
    train_ids = dataset.split["train"]

    # (2) Build every sparse format now, not inside the first next().
    t0 = time.perf_counter()
    graph.create_formats_()
    prepare_seconds = time.perf_counter() - t0
    rss_before = rss_mb()

    # (3) Seed, then DGL's loader without prefetching, and the model.
    torch.manual_seed(SEED)
    dgl.seed(SEED)
    sampler = dgl.dataloading.NeighborSampler(args.fanouts)
    loader = dgl.dataloading.DataLoader(
        graph, train_ids, sampler, batch_size=args.batch_size,
        shuffle=True, drop_last=False, num_workers=0, device="cpu",
    )
    model = build_model(
        args.model, dataset.feat_dim, args.hidden, dataset.num_classes,
        num_layers=len(args.fanouts), dropout=DROPOUT,
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)

    # (4) Train and time.
    epochs = [
        run_epoch(loader, model, optimizer, feat, label, epoch, name)
        for epoch in range(args.epochs)
    ]

    # (5) Per-epoch means and totals.
    n = len(epochs)
    seconds = {
        key: sum(e["seconds"][key] for e in epochs) / n
        for key in ("epoch", "sample", "fetch", "train")
    }
    share = {
        key: 100.0 * seconds[key] / seconds["epoch"]
        if seconds["epoch"] > 0 else 0.0
        for key in ("sample", "fetch", "train")
    }
    batches = epochs[0]["batches"]
    input_rows = sum(e["input_rows"] for e in epochs)
    total_batches = sum(e["batches"] for e in epochs)
    row_bytes = dataset.feat_dim * feat.element_size()
    return {
        "dataset": name,
        "nodes": graph.num_nodes(),
        "edges": graph.num_edges(),
        "feat_dim": dataset.feat_dim,
        "feat_dtype": str(feat.dtype).removeprefix("torch."),
        "num_classes": dataset.num_classes,
        "train_nodes": int(train_ids.numel()),
        "batches": batches,
        "seconds": seconds,
        "share_percent": share,
        "load_seconds": load_seconds,
        "prepare_seconds": prepare_seconds,
        "input_nodes_per_batch": input_rows / total_batches
        if total_batches else 0.0,
        "input_rows_total": input_rows,
        "bytes_fetched_total": input_rows * row_bytes,
        "rss_mb_before_training": rss_before,
        "peak_rss_mb": peak_rss_mb(),
        "epochs": epochs,
        "versions": {
            "torch": torch.__version__,
            "dgl": dgl.__version__,
            "python": platform.python_version(),
        },
        "torch_num_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "config": {
            "fanouts": args.fanouts,
            "batch_size": args.batch_size,
            "epochs": args.epochs,
            "model": args.model,
            "hidden": args.hidden,
            "num_layers": len(args.fanouts),
            "dropout": DROPOUT,
            "optimizer": "adam",
            "lr": LR,
            "shuffle": True,
            "num_workers": 0,
            "device": "cpu",
            "seed": SEED,
            "root": str(args.root),
        },
    }


def markdown_table(records: list[dict]) -> str:
    """One markdown row per dataset record, under `TABLE_COLUMNS`.

    Seconds and shares are per epoch (means over epochs); shares are of
    the epoch's wall time, so they may sum to a little under 100 %.
    """
    lines = [
        "| " + " | ".join(TABLE_COLUMNS) + " |",
        "|" + "|".join(
            "---" if col == "dataset" else "---:" for col in TABLE_COLUMNS
        ) + "|",
    ]
    for r in records:
        s, p = r["seconds"], r["share_percent"]
        cells = [
            r["dataset"], f"{r['nodes']:,}", f"{r['edges']:,}",
            str(r["batches"]), f"{s['epoch']:.1f}", f"{s['sample']:.1f}",
            f"{s['fetch']:.1f}", f"{s['train']:.1f}", f"{p['sample']:.1f}",
            f"{p['fetch']:.1f}", f"{p['train']:.1f}",
            f"{r['input_nodes_per_batch']:,.0f}", f"{r['peak_rss_mb']:,.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown_report(records: list[dict]) -> str:
    """The markdown file: a one-line setup summary and the table."""
    first = records[0]
    c, v = first["config"], first["versions"]
    fanouts = ",".join(str(f) for f in c["fanouts"])
    setup = (
        f"DGL DataLoader + NeighborSampler({fanouts}), batch "
        f"{c['batch_size']}, {c['model']} hidden {c['hidden']}, "
        f"{c['epochs']} epoch(s), features in memory; torch {v['torch']}, "
        f"dgl {v['dgl']}, {first['torch_num_threads']} threads. Seconds "
        f"per epoch; shares of epoch wall time."
    )
    return f"# Baseline\n\n{setup}\n\n{markdown_table(records)}"


def write_results(records: list[dict], out: Path) -> Path:
    """Write the JSON list and the markdown table, each atomically.

    Returns
    -------
    pathlib.Path
        Path of the markdown file (``out`` with suffix ``.md``).
    """
    with atomic_path(out) as tmp:
        tmp.write_text(json.dumps(records, indent=1) + "\n")
    md = out.with_suffix(".md")
    with atomic_path(md) as tmp:
        tmp.write_text(markdown_report(records))
    return md


def main(argv: list[str] | None = None) -> int:
    """Run the baseline on every dataset; return the exit status."""
    try:
        args = parse_args(argv)
    except UsageError as err:
        print(f"baseline: error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    records = []
    for name in args.datasets:
        try:
            dataset, load_seconds = load_dataset(name, args.root)
        except ValueError as err:  # hmgraph's DatasetError and the like
            print(f"baseline: error: {name}: {err}", file=sys.stderr)
            return 2
        records.append(bench_dataset(dataset, load_seconds, args))
        del dataset  # free it before the next dataset loads
        md = write_results(records, out)
    print(markdown_table(records), end="")
    print(f"wrote {out} and {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
