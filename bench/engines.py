"""The storage tier's engines: io_uring rings against a thread per read.

The same batches' input rows (DGL's ``NeighborSampler``, seeded, sampled
once per dataset) are read from the feature file with ``O_DIRECT`` by
`hmgraph.cache.storage.StorageFeature` through each engine, at the disk
model's depth, each engine in a process of its own:

- alone: seconds and the process's CPU seconds per batch, requests and
  CPU microseconds per request;
- beside a stand-in for training (``torch.mm`` on every core, in the main
  thread, as a CPU trainer's step), timed alone first in the same
  process: how much slower the matmuls run while the tier reads, and
  the tier's seconds per batch meanwhile.

Rings read rows of whole blocks straight into place (synth-igb: 4 KiB
rows, synth-papers: 512 B), and other rows (synth-products: 400 B)
into piece buffers, copying a piece's rows out as soon as its runs land
while the other reads go on. ``python bench/engines.py --quick``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import common

from hmgraph.args import name_list, positive_int

ENGINES = ("threads", "uring")
FULL = {"datasets": ["synth-igb", "synth-papers", "synth-products"],
        "max_batches": 20,
        "out": "bench/results/engines.json"}
QUICK = {"datasets": ["synth-tiny"], "max_batches": 4,
         "out": "/tmp/engines_quick.json"}
_MATMUL = 2048  # the stand-in's square matrices


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_bench_arguments(parser, training=False)
    add = parser.add_argument
    add("--datasets", type=name_list(), help="comma-separated (default: "
        f"{','.join(FULL['datasets'])}; --quick: synth-tiny)")
    add("--max-batches", type=positive_int, help="batches read per run "
        f"(default: {FULL['max_batches']})")
    add("--seed", type=int, default=0)
    add("--out", help=f"JSON file, the markdown beside it (default "
        f"{FULL['out']})")
    add("--quick", action="store_true", help="smoke run on synth-tiny")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


def _trace(args, name: str) -> tuple[list, str]:
    """Unique input ids of the dataset's first batches, and its feature
    file (a child: the graph is loaded once per dataset)."""
    import dgl  # lazy: 4 s to import

    from hmgraph.samplers.presample import presample

    data, _ = common.load(name, args.root)
    profile = presample(data.graph, dgl.dataloading.NeighborSampler(
        args.fanouts), data.split["train"], args.batch_size,
        args.max_batches, seed=args.seed)
    return [ids.numpy() for ids in profile.trace], str(data.feature_path)


def _engine(path: str, engine: str, trace: list) -> dict:
    """One engine's reads of ``trace`` from the feature file ``path``,
    alone and beside the matmuls (a child process)."""
    import torch

    from hmgraph.cache.storage import StorageFeature

    feature = StorageFeature(path, engine=engine)
    batches = [torch.from_numpy(ids) for ids in trace]
    feature.read(batches[0])  # warm: kernels compiled, buffers taken
    feature.stats.reset()
    began, cpu = time.perf_counter(), time.process_time()
    for ids in batches:
        feature.read(ids)
    alone = time.perf_counter() - began
    record = {"engine": feature.engine, "depth": feature.num_threads,
              "batches": len(batches),
              "seconds_per_batch": alone / len(batches),
              "cpu_per_batch": (time.process_time() - cpu) / len(batches),
              "requests_per_batch": feature.stats.io_requests / len(
                  batches),
              "gb_per_batch": feature.stats.bytes_read / 1e9 / len(batches)}
    record["cpu_us_per_request"] = 1e6 * record["cpu_per_batch"] / max(
        1.0, record["requests_per_batch"])
    record.update(_beside(feature, batches, alone))
    feature.close()
    return record


def _beside(feature, batches, alone: float) -> dict:
    """The matmuls timed alone, then while a thread reads ``batches``
    over and over: their slowdown and the reads' seconds per batch."""
    import torch

    a = torch.randn(_MATMUL, _MATMUL)
    torch.mm(a, a)
    began = time.perf_counter()
    count = 0
    while time.perf_counter() - began < max(alone, 2.0):
        torch.mm(a, a)
        count += 1
    compute = (time.perf_counter() - began) / count
    stop, done = threading.Event(), []

    def read():
        while not stop.is_set():
            for ids in batches:
                feature.read(ids)
                done.append(time.perf_counter())
                if stop.is_set():
                    return

    reader = threading.Thread(target=read, daemon=True)
    began = time.perf_counter()
    reader.start()
    for _ in range(count):
        torch.mm(a, a)
    took = time.perf_counter() - began
    stop.set()
    reader.join()
    read_in = [t for t in done if t - began <= took]
    return {"matmul_seconds": compute,
            "matmul_slowdown": took / count / compute,
            "beside_seconds_per_batch": took / max(1, len(read_in))}


def main(argv=None) -> int:
    args = parse_args(argv)
    environment = common.environment()  # its load average: at the start
    rows = []
    for name in args.datasets:
        trace, path = common.isolated(_trace, args, name)
        for engine in ENGINES:
            rows.append(dict(common.isolated(_engine, path, engine, trace),
                             dataset=name, asked=engine))
    by = {(r["dataset"], r["asked"]): r for r in rows}
    for row in rows:
        base = by[row["dataset"], "threads"]
        row["cpu_vs_threads"] = row["cpu_per_batch"] / base["cpu_per_batch"]
    table = common.markdown_table(
        ["dataset", "engine", "depth", "s/batch", "CPU s/batch",
         "requests/batch", "CPU us/request", "CPU vs threads (x)",
         "matmul slowdown beside (x)", "s/batch beside matmuls"],
        [[r["dataset"], r["engine"], r["depth"], r["seconds_per_batch"],
          r["cpu_per_batch"], r["requests_per_batch"],
          r["cpu_us_per_request"], r["cpu_vs_threads"],
          r["matmul_slowdown"], r["beside_seconds_per_batch"]]
         for r in rows])
    markdown = (
        f"# Storage engines: io_uring rings against a thread per read\n\n"
        f"NeighborSampler{tuple(args.fanouts)}, batch {args.batch_size}, "
        f"the first {args.max_batches} batches' unique input rows read "
        f"with O_DIRECT at the disk model's depth, no cache; beside: "
        f"{_MATMUL}x{_MATMUL} float32 matmuls on every core in the main "
        f"thread, slowdown against the same matmuls alone; "
        f"{common.environment_text(environment)}. An engine named "
        f"threads where uring was asked: a kernel without io_uring."
        f"\n\n{table}\n")
    result = {"args": vars(args), "environment": environment,
              "records": rows}
    return common.finish(result, markdown, args.out)


if __name__ == "__main__":
    sys.exit(main())
