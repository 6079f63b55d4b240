"""Write an `Assignment` in DGL's distributed partition format.

`dgl.distributed.partition_graph` computes its own assignment (random or
METIS) and takes no other. `write_partitions` takes any assignment and
writes what ``partition_graph`` writes for a homogeneous graph, through
DGL's own `dgl.partition.partition_graph_with_halo` (reshuffled ids, halo
vertices within ``num_hops``) and `dgl.data.utils.save_graphs` /
``save_tensors``::

    OUT/NAME.json             DGL's partition config (node_map, edge_map,
                              one entry per part)
    OUT/partP/graph.dgl       the part's graph: inner + halo vertices, with
                              ``_ID``, ``inner_node``, ``part_id`` and
                              ``inner_edge``
    OUT/partP/node_feat.dgl   ``_N/<name>`` rows of the vertices it owns
    OUT/partP/edge_feat.dgl   (empty)

so `dgl.distributed.load_partition` and `DistGraphServer` load it
unchanged. hmgraph adds, beside DGL's files::

    OUT/hmgraph-partition.json  method, settings, statistics
    OUT/orig_nids.npy           reshuffled id -> original id
    OUT/partP/local_ids.npy     sorted reshuffled ids whose features the
                                part stores: owned + replicated
    OUT/partP/feat.bin          those rows, an hmgraph feature file (read
                                with O_DIRECT by the trainer's cache)

Everything is written into a temporary folder next to ``OUT`` and renamed
into place, so an interrupted run leaves no partition a trainer trusts.
The folder's name carries the writer's pid (``.OUT.tmp-<pid>-*``); the
next run into ``OUT`` removes those of writers no longer running (killed).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import psutil
import torch

from hmgraph.cache.format import atomic_path, write_feature_file

__all__ = [
    "CONFIG_NAME",
    "read_partition_info",
    "remove_stale_work",
    "update_partition_info",
    "write_partitions",
]

CONFIG_NAME = "hmgraph-partition.json"


def _rows(features, ids: np.ndarray) -> np.ndarray:
    """Rows ``ids`` (sorted) of a tensor, array or feature-file memmap."""
    if isinstance(features, torch.Tensor):
        return features[torch.from_numpy(ids)].numpy()
    return np.asarray(features[ids])


def write_partitions(graph, assignment, out_dir: str | os.PathLike,
                     graph_name: str, features, node_data: dict,
                     num_hops: int = 1, stats: dict | None = None,
                     extra: dict | None = None, progress=None) -> Path:
    """Write ``assignment`` of ``graph`` as DGL partitions under ``out_dir``.

    Parameters
    ----------
    graph : dgl.DGLGraph
        Homogeneous graph; its own ndata/edata are not written.
    assignment : hmgraph.partition.Assignment
        Owner part of every vertex and per-part replicas.
    out_dir : str or os.PathLike
        Destination folder; replaced as a whole once the new one is
        complete.
    graph_name : str
        DGL's graph name (the config is ``out_dir/graph_name.json``).
    features : torch.Tensor or numpy.ndarray
        (num_nodes, ...) node features by original id (a memmap of the
        feature file is read row range by row range).
    node_data : dict of str to torch.Tensor
        Other per-node tensors (labels, masks), written per part.
    num_hops : int
        Halo hops stored with each part's graph (DGL's ``num_hops``).
    stats : dict, optional
        Statistics to record in ``hmgraph-partition.json``.
    extra : dict, optional
        More fields for ``hmgraph-partition.json`` (dataset, settings).
    progress : callable, optional
        Wraps the per-part loop (e.g. ``tqdm``).

    Returns
    -------
    pathlib.Path
        The config file, ``out_dir/graph_name.json``.
    """
    num_nodes = graph.num_nodes()
    _check_rows(num_nodes, assignment, features, node_data)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_work(out_dir)
    work = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-{os.getpid()}-",
                                 dir=out_dir.parent))
    try:
        parts, orig_nids, new_of_orig = _reshuffle(graph, assignment,
                                                   num_hops)
        metadata = _dgl_config(graph, assignment, graph_name, num_hops)
        local_rows_per_part = []
        loop = range(assignment.num_parts)
        if progress is not None:
            loop = progress(loop)
        for index in loop:
            node_range, edge_range, local_rows = _write_part(
                work, index, parts[index], assignment, new_of_orig,
                features, node_data)
            metadata["node_map"]["_N"].append(node_range)
            metadata["edge_map"]["_N:_E:_N"].append(edge_range)
            metadata[f"part-{index}"] = {
                "node_feats": f"part{index}/node_feat.dgl",
                "edge_feats": f"part{index}/edge_feat.dgl",
                "part_graph": f"part{index}/graph.dgl",
            }
            local_rows_per_part.append(local_rows)
        with open(work / f"{graph_name}.json", "w") as f:
            json.dump(metadata, f, indent=4)
        np.save(work / "orig_nids.npy", orig_nids.numpy())
        info = _hmgraph_info(graph, assignment, graph_name, num_hops,
                             local_rows_per_part, stats, extra)
        with open(work / CONFIG_NAME, "w") as f:
            json.dump(info, f, indent=2)
        _replace_dir(work, out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out_dir / f"{graph_name}.json"


def _reshuffle(graph, assignment, num_hops: int) -> tuple:
    """DGL's parts of ``graph`` with halos, in reshuffled ids.

    Returns
    -------
    tuple
        ``(parts, orig_nids, new_of_orig)``: the part graphs of
        ``partition_graph_with_halo``, the original id of every
        reshuffled id and the reshuffled id of every original id (int64).
    """
    # Lazy: DGL takes 4 s to import; reading METHODS needs none.
    import dgl
    from dgl.partition import partition_graph_with_halo

    structure = dgl.graph(graph.edges(), num_nodes=graph.num_nodes())
    parts, orig_nids, _ = partition_graph_with_halo(
        structure, assignment.parts, num_hops, reshuffle=True)
    orig_nids = orig_nids.long()
    new_of_orig = torch.empty_like(orig_nids)
    new_of_orig[orig_nids] = torch.arange(graph.num_nodes())
    return parts, orig_nids, new_of_orig


def _hmgraph_info(graph, assignment, graph_name: str, num_hops: int,
                  local_rows: list, stats: dict | None,
                  extra: dict | None) -> dict:
    """What ``hmgraph-partition.json`` holds (see `write_partitions`)."""
    return {
        "graph_name": graph_name,
        "method": assignment.method,
        "num_parts": assignment.num_parts,
        "num_nodes": graph.num_nodes(),
        "num_edges": graph.num_edges(),
        "halo_hops": num_hops,
        "settings": assignment.info,
        "replication_factor": assignment.replication_factor(),
        "local_rows": local_rows,
        "stats": stats or {},
        **(extra or {}),
    }


def _check_rows(num_nodes: int, assignment, features,
                node_data: dict) -> None:
    """Refuse an assignment, features or node data of another size.

    Raises
    ------
    ValueError
        Naming the one whose rows are not ``num_nodes``.
    """
    if assignment.num_nodes != num_nodes:
        raise ValueError(
            f"assignment covers {assignment.num_nodes} nodes, the graph has "
            f"{num_nodes}"
        )
    if len(features) != num_nodes:
        raise ValueError(
            f"features have {len(features)} rows, the graph has {num_nodes} "
            "nodes"
        )
    for name, data in node_data.items():
        if len(data) != num_nodes:
            raise ValueError(
                f"node data {name!r} has {len(data)} rows, the graph has "
                f"{num_nodes} nodes"
            )


def _dgl_config(graph, assignment, graph_name: str, num_hops: int) -> dict:
    """DGL's partition config with empty node and edge maps.

    `write_partitions` appends each part's ranges to ``node_map["_N"]``
    and ``edge_map["_N:_E:_N"]`` and adds its ``part-P`` entry.
    """
    return {
        "graph_name": graph_name,
        "num_nodes": graph.num_nodes(),
        "num_edges": graph.num_edges(),
        "part_method": assignment.method,
        "num_parts": assignment.num_parts,
        "halo_hops": num_hops,
        "node_map": {"_N": []},
        "edge_map": {"_N:_E:_N": []},
        "ntypes": {"_N": 0},
        "etypes": {"_N:_E:_N": 0},
    }


def _write_part(work: Path, index: int, part, assignment,
                new_of_orig: torch.Tensor, features,
                node_data: dict) -> tuple[list, list, int]:
    """Write part ``index`` into ``work/partINDEX``.

    DGL's ``graph.dgl``, ``node_feat.dgl`` and ``edge_feat.dgl``, and
    hmgraph's ``local_ids.npy`` and ``feat.bin`` (owned + replicated
    rows, by reshuffled id).

    Parameters
    ----------
    part : dgl.DGLGraph
        The part's graph from ``partition_graph_with_halo``; its
        ``orig_id`` data are dropped and its id data cast to the dtypes
        DGL's loader expects.
    new_of_orig : torch.Tensor
        Reshuffled id of every original id.

    Returns
    -------
    tuple
        ``(node_range, edge_range, local_rows)``: the part's reshuffled
        ``[first, end)`` node and edge ids (``[0, 0]`` when empty) and
        the rows of its feature store.
    """
    # Lazy: DGL takes 4 s to import; reading METHODS needs none.
    import dgl
    from dgl.data.utils import save_tensors

    inner = part.ndata["inner_node"].bool()
    new_ids = part.ndata[dgl.NID][inner]
    node_range = ([int(new_ids[0]), int(new_ids[-1]) + 1]
                  if len(new_ids) else [0, 0])
    inner_e = part.edata["inner_edge"].bool()
    eids = part.edata[dgl.EID][inner_e]
    edge_range = ([int(eids.min()), int(eids.max()) + 1]
                  if len(eids) else [0, 0])
    owned_orig = part.ndata["orig_id"][inner]
    folder = work / f"part{index}"
    folder.mkdir()
    # The part's store (owned + replicated rows, by reshuffled id) is read
    # once; its owned rows are a slice of it.
    local_orig = assignment.local_ids(index)
    local_new, order = torch.sort(new_of_orig[local_orig])
    local_rows = np.ascontiguousarray(
        _rows(features, local_orig[order].numpy()))
    feats = {f"_N/{name}": data[owned_orig]
             for name, data in node_data.items()}
    owned_at = torch.searchsorted(local_new, new_ids).numpy()
    feats["_N/feat"] = torch.from_numpy(local_rows[owned_at])
    save_tensors(str(folder / "node_feat.dgl"), feats)
    save_tensors(str(folder / "edge_feat.dgl"), {})
    del part.ndata["orig_id"]
    del part.edata["orig_id"]
    for key, dtype in (("inner_node", torch.uint8),
                       ("inner_edge", torch.uint8),
                       (dgl.NID, torch.int64),
                       (dgl.EID, torch.int64),
                       ("part_id", torch.int64)):
        for frame in (part.ndata, part.edata):
            if key in frame:
                frame[key] = frame[key].to(dtype)
    dgl.save_graphs(str(folder / "graph.dgl"), [part])
    # hmgraph's local feature store: owned + replicated rows.
    np.save(folder / "local_ids.npy", local_new.numpy())
    write_feature_file(folder / "feat.bin", local_rows)
    return node_range, edge_range, local_new.numel()


def remove_stale_work(out_dir: str | os.PathLike) -> list[Path]:
    """Remove what writers of ``out_dir`` that were killed left beside it.

    `write_partitions` works in ``.OUT.tmp-<pid>-*`` and moves an old
    ``OUT`` aside to ``.OUT.old-<pid>`` while it swaps the new one in;
    those of pids no longer running are removed, except an old ``OUT``
    whose writer was killed between the two renames: that one (complete)
    is moved back to ``OUT``. Called by every `write_partitions`.

    Returns
    -------
    list of pathlib.Path
        The folders removed (or moved back).
    """
    out_dir = Path(out_dir)
    pattern = re.compile(rf"\.{re.escape(out_dir.name)}\.(?:tmp-(\d+)-.*|"
                         rf"old-(\d+))")
    removed = []
    if not out_dir.parent.is_dir():
        return removed
    for path in sorted(out_dir.parent.iterdir()):
        found = pattern.fullmatch(path.name)
        if not found or not path.is_dir() or path.is_symlink() or \
                psutil.pid_exists(int(found.group(1) or found.group(2))):
            continue
        if found.group(2) and not out_dir.exists():
            os.rename(path, out_dir)
        else:
            shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _replace_dir(new: Path, target: Path) -> None:
    """Rename ``new`` to ``target``, replacing an old ``target`` last."""
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.rename(target, old)
        os.rename(new, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(new, target)


def read_partition_info(parts_dir: str | os.PathLike) -> dict:
    """The ``hmgraph-partition.json`` of a partition folder.

    Raises
    ------
    FileNotFoundError
        If ``parts_dir`` holds no partition written by hmgraph.
    """
    path = Path(parts_dir) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: {parts_dir} is not a partition folder "
            "written by `hmgraph partition`"
        )
    with open(path) as f:
        info = json.load(f)
    info["config"] = str(Path(parts_dir) / f"{info['graph_name']}.json")
    return info


def update_partition_info(parts_dir: str | os.PathLike, **fields) -> None:
    """Add ``fields`` to ``hmgraph-partition.json``, atomically."""
    path = Path(parts_dir) / CONFIG_NAME
    info = read_partition_info(parts_dir)
    info.pop("config")
    info.update(fields)
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            json.dump(info, f, indent=2)
