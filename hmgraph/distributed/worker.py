"""The processes `hmgraph train-dist` starts: DGL servers and trainers.

Run by the launcher as ``python -m hmgraph.distributed.worker ROLE JOB
RANK``, where JOB is the launcher's JSON job file:

* ``server``: one `dgl.distributed.DistGraphServer` per part (one "machine"
  per part; several share this host, so shared memory is off and clients
  talk to every server over loopback sockets). It returns when the trainers
  shut the servers down.
* ``trainer``: `dgl.distributed.initialize`, a `DistGraph` with its part's
  partition book, ``torch.distributed`` (gloo on CPU, nccl on GPU) and
  `DistributedDataParallel`. Its seeds are the training vertices its part
  owns (split among the part's trainers); batches come from
  `hmgraph.DataLoader` over the `DistGraph`, with DGL's distributed
  sampling and a coordinated cache over a `PartitionFeature` (local rows
  from the part's own feature file, the rest pulled from their owners).
  Uneven numbers of batches across trainers are handled by DDP's
  ``join``. After the last epoch every trainer scores its share of the
  validation and test vertices with full neighbourhoods; counts are summed
  with ``all_reduce`` and rank 0 writes the job's result file; after the
  last collective each trainer leaves a ``done`` file for the launcher.

Every worker exits when the launcher dies (its parent changes), so a
killed launcher leaves no orphans behind, and prints every thread's Python
stack on ``SIGUSR1`` (`STACKS_SIGNAL`), which the launcher sends to a job
it stops for taking too long: the stacks say where it was stuck.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from hmgraph.cache.budget import parse_budget
from hmgraph.distributed.feature import PartitionFeature, PartLabels

__all__ = ["STACKS_SIGNAL", "main", "watch_parent"]

#: The signal on which a worker prints its threads' Python stacks.
STACKS_SIGNAL = signal.SIGUSR1


def watch_parent(parent: int) -> None:
    """Exit at once when the process ``parent`` (the launcher) is gone.

    A daemon thread polls the parent pid twice a second, so a worker whose
    launcher was killed does not run on alone.
    """
    def watch():
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True, name="hmgraph-watch").start()


def run_server(job: dict, rank: int) -> None:
    # Lazy, as in run_trainer: DGL takes 4 s to import, and the launcher
    # imports this module for STACKS_SIGNAL.
    from dgl.distributed import DistGraphServer

    from hmgraph.distributed.loopback import emulate_machine

    emulate_machine(rank, str(job["launcher_pid"]))
    server = DistGraphServer(
        rank, job["ip_config"], 1, job["trainers"], job["part_config"],
        disable_shared_mem=True, graph_format=["csc", "coo"],
    )
    server.start()


def run_trainer(job: dict, rank: int) -> None:
    # Lazy: DGL, the loader and the models (see run_server).
    import dgl
    from dgl.distributed import DistGraph, load_partition_book

    from hmgraph.distributed.sampling import LockedNeighborSampler
    from hmgraph.loader import DataLoader

    # (1) Join the job: DGL's servers, torch.distributed, the device.
    part, local_rank, per_part, device = _join(job, rank)
    gpb, graph_name, _, _ = load_partition_book(job["part_config"], part)
    graph = DistGraph(graph_name, gpb=gpb)
    lock = threading.Lock()
    # (2) The part's seeds, features and labels; the sampler and model.
    (train_ids, valid_ids, test_ids), features, labels = _part_data(
        job, part, local_rank, per_part, graph, lock)
    fanouts = job["fanouts"]
    sampler = LockedNeighborSampler(fanouts, lock, gpb, part)
    model, optimizer = _model(job, features.row_shape[0], len(fanouts),
                              device)
    feature_bytes = features.row_bytes * features.num_rows
    cache = None if job["cache"] == "none" else job["cache"]
    loader = DataLoader(
        graph, train_ids, sampler, batch_size=job["batch_size"],
        shuffle=True, features=features, labels=labels, cache=cache,
        device_budget_bytes=parse_budget(job["device_budget"],
                                         feature_bytes),
        host_budget_bytes=parse_budget(job["host_budget"], feature_bytes),
        prefetch=job.get("prefetch", 2), device=device,
        seed=job["seed"] + rank,
    )
    # (3) The epochs, each scored on valid and test.
    epochs, best = [], None
    for epoch in range(job["epochs"]):
        loader.set_epoch(epoch)
        dgl.seed(job["seed"] + rank + epoch)
        loader.stats.reset()  # resets features.stats too (the bottom tier)
        sampler.stats.reset()
        began = time.perf_counter()
        loss = _train_epoch(model, optimizer, loader, rank, epoch,
                            job.get("log_every", 0))
        record = {
            "epoch": epoch,
            "loss": loss,
            "seconds": time.perf_counter() - began,
            "loader": loader.stats.as_dict(),
            "features": features.stats.as_dict(),
            "sampling": sampler.stats.as_dict(),
        }
        for name, ids in (("valid", valid_ids), ("test", test_ids)):
            correct, total = _evaluate(model.module, graph, features,
                                       labels, ids, len(fanouts), lock,
                                       device)
            counts = torch.tensor([correct, total], dtype=torch.float64)
            dist.all_reduce(counts)
            record[name] = float(counts[0] / counts[1]) if counts[1] else 0.0
        epochs.append(record)
        if best is None or record["valid"] > best["valid"]:
            best = record
    loader.close()
    (plan,) = loader.plan.values()  # the one node type's
    # (4) Rank 0 writes the job's result; every trainer leaves.
    _write_result(job, rank, best, {
        "rank": rank,
        "part": part,
        "train_vertices": int(train_ids.numel()),
        "epochs": epochs,
        "plan": plan.as_dict(),
    })
    features.close()
    dist.barrier()
    dist.destroy_process_group()
    # Done: what is left is DGL's own shutdown at exit, which can hang
    # (dmlc/dgl#5300); the launcher stops a trainer stuck there.
    done = Path(job["done"].format(rank=rank))
    done.with_suffix(".tmp").write_text("done\n")
    os.replace(done.with_suffix(".tmp"), done)


def _join(job: dict, rank: int) -> tuple:
    """Connect trainer ``rank`` to DGL's servers and to the other trainers.

    Returns
    -------
    tuple
        ``(part, local_rank, per_part, device)``: the part it trains on,
        its rank among that part's ``per_part`` trainers and its device
        (``cuda:local_rank`` modulo the GPUs when the job asks for cuda).
    """
    # Lazy: DGL (see run_server).
    import dgl

    from hmgraph.distributed.loopback import emulate_machine

    torch.set_num_threads(job.get("threads", 1))
    world = job["trainers"]
    per_part = world // job["num_parts"]
    part = rank // per_part
    local_rank = rank % per_part
    emulate_machine(part, str(job["launcher_pid"]))
    dgl.distributed.initialize(job["ip_config"])
    dist.init_process_group(
        "nccl" if job["device"].startswith("cuda") else "gloo",
        init_method=f"file://{job['store']}",
        rank=rank, world_size=world,
    )
    device = torch.device(job["device"])
    if device.type == "cuda":
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    return part, local_rank, per_part, device


def _part_data(job: dict, part: int, local_rank: int, per_part: int,
               graph, lock: threading.Lock) -> tuple:
    """This trainer's seeds and its part's features and labels.

    Returns
    -------
    tuple
        ``((train_ids, valid_ids, test_ids), features, labels)``: every
        ``per_part``-th vertex of each split the part owns, from
        ``local_rank`` on (global ids); a `PartitionFeature` and
        `PartLabels` over the `DistGraph` ``graph``.
    """
    # Lazy: DGL (see run_server).
    from dgl.data.utils import load_tensors

    part_dir = Path(job["parts_dir"]) / f"part{part}"
    start = int(job["node_map"][part][0])
    # The part's own vertices' tensors (DGL's node_feat.dgl), read once.
    owned = load_tensors(str(part_dir / "node_feat.dgl"))

    def mine(mask_name):
        mask = owned[f"_N/{mask_name}"].bool()
        ids = torch.nonzero(mask).flatten() + start
        return ids[local_rank::per_part]

    ids = (mine("train_mask"), mine("valid_mask"), mine("test_mask"))
    features = PartitionFeature(part_dir, graph.ndata["feat"], lock)
    labels = PartLabels(owned["_N/label"].long(), start,
                        graph.ndata["label"], lock)
    return ids, features, labels


def _model(job: dict, in_feats: int, num_layers: int, device) -> tuple:
    """The job's model in `DistributedDataParallel`, and its optimizer.

    Seeded with ``job["seed"]`` first, so every trainer starts alike.
    """
    # Lazy: the models load DGL (see run_server).
    from hmgraph.models import build_model

    torch.manual_seed(job["seed"])
    model = build_model(
        job["model"], in_feats, job["hidden"], job["num_classes"],
        num_layers=num_layers, dropout=job["dropout"],
        num_heads=job.get("num_heads", 4),
    ).to(device)
    model = DistributedDataParallel(
        model, device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=job["lr"],
                                 weight_decay=job.get("weight_decay", 0.0))
    return model, optimizer


def _train_epoch(model, optimizer, loader, rank: int, epoch: int,
                 log_every: int) -> float:
    """One epoch over ``loader``; the mean loss per output vertex.

    Under DDP's ``join``, so trainers with fewer batches than others do
    not stall the gradients' all-reduce; every ``log_every`` batches (0:
    never) a line of the loss.
    """
    model.train()
    total_loss, seen = 0.0, 0
    with model.join():
        for index, batch in enumerate(loader):
            logits = model(batch.blocks, batch.x)
            loss = F.cross_entropy(logits, batch.y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total_loss += float(loss) * batch.y.numel()
            seen += batch.y.numel()
            if log_every and index % log_every == 0:
                print(f"trainer {rank}: epoch {epoch} batch {index} "
                      f"loss {float(loss):.4f}", flush=True)
    return total_loss / max(1, seen)


def _write_result(job: dict, rank: int, best: dict, record: dict) -> None:
    """Gather every trainer's ``record``; rank 0 writes the job's result.

    The result file holds ``accuracy`` (valid, test and epoch of ``best``,
    the epoch of best validation accuracy) and ``trainers`` (the records
    by rank); written to a temporary name and renamed into place.
    """
    scores = {"valid": best["valid"], "test": best["test"],
              "epoch": best["epoch"]}
    records = [None] * job["trainers"]
    dist.all_gather_object(records, record)
    if rank == 0:
        result = {"accuracy": scores, "trainers": records}
        tmp = Path(job["result"]).with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=2))
        os.replace(tmp, job["result"])


def _evaluate(model, graph, features, labels, ids, num_layers, lock, device):
    """Correct predictions and count over ``ids``, full neighbourhoods."""
    from hmgraph.distributed.sampling import (  # lazy: loads DGL
        LockedNeighborSampler,
    )

    sampler = LockedNeighborSampler([-1] * num_layers, lock)
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for begin in range(0, ids.numel(), 1024):
            seeds = ids[begin:begin + 1024]
            input_nodes, output_nodes, blocks = sampler.sample(graph, seeds)
            x = features.read(input_nodes).to(device)
            logits = model(blocks, x)
            y = labels[output_nodes].to(device)
            correct += int((logits.argmax(-1) == y).sum())
            total += int(y.numel())
    return correct, total


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    role, job_path, rank = argv[0], argv[1], int(argv[2])
    job = json.loads(Path(job_path).read_text())
    watch_parent(job["launcher_pid"])
    faulthandler.register(STACKS_SIGNAL, all_threads=True)
    os.environ["DGL_DIST_MODE"] = "distributed"
    os.environ["DGL_NUM_SERVER"] = "1"
    os.environ["DGL_NUM_SAMPLER"] = "0"
    if role == "server":
        run_server(job, rank)
    elif role == "trainer":
        run_trainer(job, rank)
    else:
        raise SystemExit(f"unknown role {role!r}; expected server or trainer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
