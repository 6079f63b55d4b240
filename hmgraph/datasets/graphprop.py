"""OGB graph-property datasets (``ogbg-mol*``) as `GraphDataset`.

Loaded through ``ogb.graphproppred.DglGraphPropPredDataset`` from a local
copy in OGB's layout (``ROOT/ogbg_molbace/raw/*.csv.gz``, ``split/``,
``mapping/``); nothing is downloaded. Two details of ogb are handled here:

- A copy without OGB's release marker (``RELEASE_v1.txt``) makes ogb ask on
  stdin whether to delete it and download again; we answer "no" (see
  `hmgraph.datasets.ogb_prompts.answer_ogb_prompts`).
- ogb writes ``processed/dgl_data_processed`` under the dataset folder. A
  folder we cannot write (shared, read-only data) is first copied, once and
  atomically, to ``$HMGRAPH_CACHE/ogbg/<digest>/<folder>`` (default
  ``~/.cache/hmgraph``; the digest names the source's content, see
  `hmgraph.datasets.sources`), and ogb works on the copy.

Every molecule set of ogb 1.3.6's ``master.csv`` (``ogbg-mol*``:
single- and multi-task binary classification such as ``ogbg-molhiv`` /
``ogbg-moltox21``, regression such as ``ogbg-molesol``) loads the same
way, as OGB's own examples train them: labels are float, shape
``(num_graphs, num_tasks)``, NaN where a task is unlabelled; the model has
one output per task (``num_classes`` is the number of tasks); the loss is
binary cross-entropy on the logits (classification) or squared error
(regression) over the labelled entries only; OGB's ``Evaluator`` scores
the raw outputs (``rocauc``, ``ap`` or ``rmse``). Atom features (9
categorical columns) become the concatenation of their one-hots
(``ogb.utils.features.get_atom_feature_dims``, 174 columns); bond
features are not used.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import tempfile
from pathlib import Path

import numpy as np

from hmgraph.datasets import DatasetError
from hmgraph.datasets.ogb_prompts import answer_ogb_prompts
from hmgraph.datasets.pickles import ogb_split
from hmgraph.datasets.sources import source_digest, source_files
from hmgraph.datasets.tu import GraphDataset

__all__ = ["OGB_GRAPH_DATASETS", "TASK_TYPES", "load_ogbg"]


def _molecule_sets() -> tuple:
    """The ``ogbg-mol*`` names of ogb's ``master.csv``, in its order."""
    import ogb.graphproppred
    import pandas as pd

    master = pd.read_csv(Path(ogb.graphproppred.__file__).with_name(
        "master.csv"), index_col=0)
    return tuple(name for name in master.columns
                 if name.startswith("ogbg-mol"))


#: Every OGB molecule set (ogb 1.3.6: bace, bbbp, clintox, muv, pcba,
#: sider, tox21, toxcast, hiv, esol, freesolv, lipo, chembl).
OGB_GRAPH_DATASETS = _molecule_sets()
#: ogb's task types, as `GraphDataset.task` names them.
TASK_TYPES = {"binary classification": "binary", "regression": "regression"}


def load_ogbg(name: str, root: str | os.PathLike) -> GraphDataset:
    """Load an OGB molecule dataset from ``root``.

    Parameters
    ----------
    name : str
        One of `OGB_GRAPH_DATASETS`, e.g. ``"ogbg-molesol"``.
    root : str or os.PathLike
        Folder that holds ``ogbg_molbace/`` (OGB's folder name).

    Returns
    -------
    GraphDataset
        Features on the CPU; ``labels`` float32 ``(num_graphs,
        num_tasks)``, NaN where unlabelled; ``task`` ``"binary"`` or
        ``"regression"``; ``num_classes`` the number of tasks;
        ``metric`` from OGB (``rocauc``, ``ap``, ``rmse``);
        ``evaluator`` an ``ogb.graphproppred.Evaluator``; ``split`` the
        official scaffold split.

    Raises
    ------
    DatasetError
        Unknown name, or no local copy under ``root``.
    """
    if name not in OGB_GRAPH_DATASETS:
        raise DatasetError(
            f"unknown OGB graph dataset {name!r}; supported: "
            f"{', '.join(OGB_GRAPH_DATASETS)}"
        )
    folder = Path(root) / name.replace("-", "_")
    if not (folder / "raw").is_dir():
        raise DatasetError(
            f"{name} not found: expected {folder}/raw/ (OGB's layout); "
            f"fetch it where there is internet with ogb "
            f"(DglGraphPropPredDataset({name!r}, root=...)) and copy "
            f"{folder.name}/ into {root}"
        )
    folder = _writable_copy(folder)
    return _from_ogb(name, folder)


def _from_ogb(name: str, folder: Path) -> GraphDataset:
    import dgl
    import torch
    from ogb.graphproppred import DglGraphPropPredDataset, Evaluator
    from ogb.utils.features import get_atom_feature_dims

    # ogb prints progress ("Saving...", tqdm bars); keep the CLI's clean.
    quiet = io.StringIO()
    with answer_ogb_prompts(answer="n"), contextlib.redirect_stdout(quiet), \
            contextlib.redirect_stderr(quiet):
        ds = DglGraphPropPredDataset(name, root=str(folder.parent))
        split = ogb_split(ds)
    graph = dgl.batch(list(ds.graphs))
    src, dst = graph.edges()
    atoms = graph.ndata["feat"].numpy()
    dims = get_atom_feature_dims()
    offsets = np.concatenate([[0], np.cumsum(dims)[:-1]])
    features = np.zeros((atoms.shape[0], int(sum(dims))), dtype=np.float32)
    rows = np.repeat(np.arange(atoms.shape[0]), atoms.shape[1])
    features[rows, (atoms + offsets).reshape(-1)] = 1.0
    task = TASK_TYPES.get(ds.task_type)
    if task is None:  # not a molecule set's: none of ogb 1.3.6's has it
        raise DatasetError(f"{name}: task type {ds.task_type!r} is not "
                           f"supported; supported: {', '.join(TASK_TYPES)}")
    labels = ds.labels.reshape(len(ds.graphs), -1).float()
    return GraphDataset.from_edges(
        name, src.numpy(), dst.numpy(), graph.batch_num_nodes().numpy(),
        features, labels.numpy(), num_classes=int(ds.num_tasks), task=task,
        metric=ds.eval_metric, evaluator=Evaluator(name),
        split={k: torch.as_tensor(v).long() for k, v in split.items()},
        info={"folder": str(folder)},
    )


def _writable_copy(folder: Path) -> Path:
    """``folder`` itself if we may write in it, else a cached copy.

    The copy is ``$HMGRAPH_CACHE/ogbg/<digest>/<folder name>``, the digest
    naming the source files' content (`source_digest`): another copy that
    differs gets a copy of its own, never this one's processed files.
    """
    if os.access(folder, os.W_OK) and os.stat(folder).st_mode & stat.S_IWUSR:
        return folder
    cache = Path(os.environ.get("HMGRAPH_CACHE", "~/.cache/hmgraph"))
    digest = source_digest(source_files(folder), folder)
    target = cache.expanduser() / "ogbg" / digest[:16] / folder.name
    if (target / "raw").is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent,
                                    prefix=f".{folder.name}-"))
    try:
        shutil.copytree(folder, staging / folder.name,
                        copy_function=shutil.copyfile)
        for path in [staging / folder.name,
                     *(staging / folder.name).rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR | stat.S_IRUSR)
        os.replace(staging / folder.name, target)
    except OSError:
        if not (target / "raw").is_dir():  # not a concurrent copy's win
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
