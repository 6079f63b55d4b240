"""Node datasets: OGB, synthetic (in OGB's format) and Planetoid.

Examples
--------
>>> from hmgraph import datasets
>>> data = datasets.load("synth-tiny", root="data")  # doctest: +SKIP
>>> data.graph, data.split["train"], data.feature_path  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
from pathlib import Path

import torch

from hmgraph.cache.format import (
    REBUILD,
    atomic_path,
    read_manifest,
    verify_feature_file,
)
from hmgraph.datasets.base import (
    FEATURE_FILE,
    AccuracyEvaluator,
    NodeDataset,
    as_labels,
    attach_feature_file,
    read_feature_rows,
)
from hmgraph.datasets.locking import exclusive_lock
from hmgraph.datasets.ogb_prompts import answer_ogb_prompts
from hmgraph.datasets.ogb_stream import (
    STREAMED,
    read_raw_graph,
    stream_features,
)
from hmgraph.datasets.pickles import ogb_split
from hmgraph.datasets.planetoid import PLANETOID, find_planetoid, read_planetoid
from hmgraph.datasets.sources import source_digest, source_files
from hmgraph.datasets.synthetic import SPECS, make_synthetic, meta_dict
from hmgraph.datasets.synthetic import (
    check_feature_file as check_synthetic_features,
)
from hmgraph.datasets.synthetic import feature_path as synthetic_feature_path

log = logging.getLogger(__name__)

__all__ = [
    "AccuracyEvaluator",
    "DatasetError",
    "NodeDataset",
    "OGB_NODE_DATASETS",
    "known_datasets",
    "load",
]

OGB_NODE_DATASETS = ("ogbn-arxiv", "ogbn-products", "ogbn-papers100M")
# OGB stores these as directed edge lists; GNNs train on both directions.
_DIRECTED = {"ogbn-arxiv", "ogbn-papers100M"}
_DOWNLOAD_TIMEOUT_SECONDS = 30
# Hex digits of a source digest in a cache folder's name.
_DIGEST_CHARS = 16


class DatasetError(ValueError):
    """A dataset cannot be found, read or used; the message says why."""


def known_datasets() -> list[str]:
    """Names `load` accepts."""
    return [*SPECS, *PLANETOID, *OGB_NODE_DATASETS]


def load(
    name: str, root: str | os.PathLike = "data", verify: bool = True,
    features_on: str = "memory", progress: bool = False,
) -> NodeDataset:
    """Load a node-classification dataset.

    Parameters
    ----------
    name : str
        One of `known_datasets`: the synthetic ``synth-*`` sets (generated
        under ``root`` on first use and reused), ``cora`` / ``citeseer`` /
        ``pubmed`` (Planetoid files under ``root``), ``ogbn-arxiv`` /
        ``ogbn-products`` / ``ogbn-papers100M`` (a copy in OGB's layout
        under ``root``, else downloaded by ogb).
    root : str or os.PathLike
        Folder that holds the datasets; must exist.
    verify : bool
        Recompute the feature file's checksum (reads the whole file).
    features_on : str
        ``"memory"``: rows also in ``graph.ndata["feat"]``. ``"disk"``:
        rows only in the feature file; nothing holds the feature matrix
        (synthetic sets never load it; OGB and Planetoid sets that ogb
        loads into memory write the file and drop the rows).
    progress : bool
        Show progress bars while generating a synthetic set.

    Returns
    -------
    NodeDataset
        Graph, labels, split, classes, evaluator and feature file.

    Raises
    ------
    DatasetError
        Unknown name, missing root, missing data, empty split, a feature
        file that does not fit the graph.
    hmgraph.datasets.pickles.UnsafePickleError
        A pickled dataset file (a split, a Planetoid file) names anything
        its format never holds; nothing in it is run.
    """
    root = Path(root)
    _check_request(name, root, features_on)
    if name in SPECS:
        folder = make_synthetic(name, root, progress=progress)
        check_synthetic_features(folder)
        dataset = _load_ogb_format(name, folder, True)
        dataset.feature_path = _checked(synthetic_feature_path(folder),
                                        dataset.num_nodes, verify)
        if features_on == "memory":
            dataset.graph.ndata["feat"] = read_feature_rows(
                dataset.feature_path)
    elif name in STREAMED:
        dataset = _load_streamed(name, root, features_on, verify, progress)
    else:
        dataset = _load_planetoid(name, root) if name in PLANETOID \
            else _load_ogbn(name, root)
        folder = _cache_folder(dataset.info["folder"], name)
        dataset.feature_path = attach_feature_file(
            dataset.graph.ndata["feat"], folder, verify=verify
        )
        if features_on == "disk":
            dataset.graph.ndata.pop("feat")
    dataset.features_on = features_on
    for part in ("train", "valid", "test"):
        if dataset.split[part].numel() == 0:
            raise DatasetError(f"dataset {name} has an empty {part} split")
    return dataset


def _check_request(name: str, root: Path, features_on: str) -> None:
    """Refuse an unknown name, a bad ``features_on`` or a missing root.

    Raises
    ------
    DatasetError
        One line naming the bad value and what is accepted.
    """
    if name not in known_datasets():
        raise DatasetError(
            f"unknown dataset {name!r}; known: {', '.join(known_datasets())}"
        )
    if features_on not in ("memory", "disk"):
        raise DatasetError(
            f"features_on must be 'memory' or 'disk', got {features_on!r}"
        )
    if root.exists() and not root.is_dir():
        raise DatasetError(f"dataset root {str(root)!r} is a file, not a "
                           f"folder; pass a folder as --root")
    if not root.is_dir():
        raise DatasetError(
            f"dataset root {str(root)!r} does not exist; create it "
            f"(mkdir -p {root}) or pass an existing --root"
        )


def _load_streamed(name: str, root: Path, features_on: str, verify: bool,
                   progress: bool) -> NodeDataset:
    """An OGB binary dataset read from its raw files, features streamed.

    See `hmgraph.datasets.ogb_stream`: the feature matrix is never held;
    the feature file and the built graph are cached like other datasets'.
    """
    # Lazy, as ogb and DGL below: 3 s and 4 s to import, and
    # `known_datasets` (the command line's choices) needs neither.
    from ogb.nodeproppred import Evaluator

    folder = root / name.replace("-", "_")
    if not (folder / "raw" / "data.npz").is_file():
        raise DatasetError(
            f"{name} is not under {folder} (expected {folder}/raw/data.npz, "
            f"OGB's layout); fetch it where there is internet with ogb "
            f"(DglNodePropPredDataset({name!r}, root=...), or download and "
            f"unzip its archive) and copy its folder {folder.name}/ into "
            f"{root}"
        )
    cache = _cache_folder(folder, name)
    target = cache / FEATURE_FILE
    _stream_unless_current(folder, cache, target, progress)
    graph, raw_labels, split = read_raw_graph(folder, cache,
                                              bidirected=name in _DIRECTED)
    labels = as_labels(raw_labels)
    graph.ndata["label"] = labels
    dataset = NodeDataset(
        name=name, graph=graph, labels=labels,
        split={k: torch.as_tensor(v).long() for k, v in split.items()},
        num_classes=int(labels.max()) + 1, evaluator=Evaluator(name),
        feature_path=_checked(target, graph.num_nodes(), verify),
        info={"folder": folder},
    )
    if features_on == "memory":
        graph.ndata["feat"] = read_feature_rows(target)
    return dataset


#: Beside a streamed set's feature file: the digest of the raw files it
#: and the cached graph were made from.
_SOURCE_RECORD = "source.json"
#: The graph `read_raw_graph` caches beside the feature file.
_STREAMED_GRAPH = "graph.dgl"


def _stream_unless_current(folder: Path, cache: Path, target: Path,
                           progress: bool) -> None:
    """Stream the features into ``target`` unless made from these raw files.

    ``cache/source.json`` names the digest of ``folder/raw`` that the
    feature file and the cached graph were made from; when it is missing
    or names other files (the dataset changed in place), or the feature
    file is gone, both are made again: one process, under ``cache/.lock``,
    while others wait.
    """
    digest = source_digest(source_files(folder / "raw"), folder)
    record = cache / _SOURCE_RECORD

    def current() -> bool:
        try:
            made_from = json.loads(record.read_text()).get("raw_sha256")
        except (OSError, ValueError, AttributeError):
            return False
        return made_from == digest and os.path.lexists(target)

    if current():
        return
    with exclusive_lock(cache / ".lock", target):
        if current():  # another run made them meanwhile
            return
        record.unlink(missing_ok=True)
        (cache / _STREAMED_GRAPH).unlink(missing_ok=True)
        stream_features(folder / "raw", target, progress=progress)
        with atomic_path(record) as tmp:  # written last: the marker
            tmp.write_text(json.dumps({"raw_sha256": digest}))


def _checked(path: Path, num_nodes: int, verify: bool) -> Path:
    """``path`` if it is a feature file of ``num_nodes`` rows.

    Used for the files hmgraph makes again once deleted (a synthetic set's,
    a streamed OGB set's), which its messages advise.
    """
    manifest = verify_feature_file(path) if verify else read_manifest(path)
    if manifest.num_rows != num_nodes:
        raise DatasetError(
            f"feature file {path} holds {manifest.num_rows} rows but the "
            f"graph has {num_nodes} nodes; {REBUILD}"
        )
    return path


def _cache_folder(dataset_folder: Path, name: str) -> Path:
    """Where hmgraph keeps its own files of a dataset.

    Beside the dataset when its folder is writable by its owner; a folder
    without write bits (shared, read-only data) is left untouched and the
    files go under ``$HMGRAPH_CACHE`` (default ``~/.cache/hmgraph``), in
    ``<name>/<digest>/``: the digest names the source files' content
    (`hmgraph.datasets.sources.source_digest`), so two copies that differ
    never share derived files.
    """
    mode = os.stat(dataset_folder).st_mode
    if mode & stat.S_IWUSR and os.access(dataset_folder, os.W_OK):
        return Path(dataset_folder) / "hmgraph"
    cache = os.environ.get("HMGRAPH_CACHE", "~/.cache/hmgraph")
    pattern = f"ind.{name}.*" if name in PLANETOID else "**/*"
    digest = source_digest(source_files(dataset_folder, pattern),
                           dataset_folder)
    return Path(cache).expanduser() / name / digest[:_DIGEST_CHARS]


def _load_ogb_format(name: str, folder: Path, synthetic: bool):
    from ogb.nodeproppred import (  # lazy: see _load_streamed
        DglNodePropPredDataset,
        Evaluator,
    )

    with answer_ogb_prompts(answer="n"):
        if synthetic:
            ds = DglNodePropPredDataset(
                "ogbn-" + name, meta_dict=meta_dict(folder)
            )
        else:
            ds = DglNodePropPredDataset(name, root=str(folder.parent))
    return _from_ogb(name, ds, folder, synthetic, Evaluator)


def _from_ogb(name, ds, folder, synthetic, evaluator_cls):
    import dgl  # lazy: see _load_streamed

    graph, raw_labels = ds[0]
    if synthetic:  # every undirected edge is stored once
        graph = dgl.add_reverse_edges(graph, copy_ndata=True)
    elif name in _DIRECTED:
        graph = dgl.to_bidirected(graph, copy_ndata=True)
    labels = as_labels(raw_labels)
    graph.ndata["label"] = labels
    split = {k: torch.as_tensor(v).long() for k, v in
             ogb_split(ds).items()}
    evaluator = AccuracyEvaluator(name) if synthetic else evaluator_cls(name)
    return NodeDataset(
        name=name, graph=graph, labels=labels, split=split,
        num_classes=int(ds.num_classes), evaluator=evaluator,
        feature_path=Path(), info={"folder": folder},
    )


def _load_ogbn(name: str, root: Path) -> NodeDataset:
    folder = root / name.replace("-", "_")
    local = (folder / "processed" / "dgl_data_processed").is_file() or (
        folder / "raw"
    ).is_dir()
    if local:
        return _load_ogb_format(name, folder, synthetic=False)
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(_DOWNLOAD_TIMEOUT_SECONDS)
    try:
        with answer_ogb_prompts(answer="y"):
            return _load_ogb_format(name, folder, synthetic=False)
    except (OSError, EOFError, SystemExit) as err:
        raise DatasetError(
            f"{name} is not under {folder} and could not be downloaded "
            f"({type(err).__name__}: {err}); fetch it where there is "
            f"internet with ogb (DglNodePropPredDataset({name!r}, "
            f"root=...)) and copy its folder {folder.name}/ into {root}"
        ) from None
    finally:
        socket.setdefaulttimeout(previous)


def _load_planetoid(name: str, root: Path) -> NodeDataset:
    import dgl  # lazy: see _load_streamed

    folder = find_planetoid(name, root)
    if folder is None:
        raise DatasetError(
            f"{name} not found under {root}: expected "
            f"{root / PLANETOID[name]}/ind.{name}.x (Planetoid files); "
            f"pass --root to the folder that holds {PLANETOID[name]}/"
        )
    data = read_planetoid(name, folder)
    graph = dgl.graph((data["src"], data["dst"]),
                      num_nodes=data["num_nodes"])
    graph.ndata["feat"] = data["feat"]
    graph.ndata["label"] = data["label"]
    return NodeDataset(
        name=name, graph=graph, labels=data["label"],
        split={k: data[k] for k in ("train", "valid", "test")},
        num_classes=data["num_classes"],
        evaluator=AccuracyEvaluator(name), feature_path=Path(),
        info={"folder": folder},
    )
