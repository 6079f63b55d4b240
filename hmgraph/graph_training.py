"""Training one graph-level model: the task's loss and metric, a flat
Adam over the model's parameters, standardised regression targets and
the ensemble of inner models (see `hmgraph.classify`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hmgraph.memory import check_model_memory as check_training_memory

__all__ = ["LOWER_IS_BETTER", "Ensemble", "TargetScale", "Trainer",
           "build_model", "check_model_memory", "evaluate",
           "flat_parameters", "score", "selection_sign", "target_scale",
           "task_loss"]

#: OGB metrics where lower is better; every other metric is higher-better.
LOWER_IS_BETTER = ("rmse", "mae")


def task_loss(dataset, out, labels) -> torch.Tensor:
    """The training loss of ``dataset``'s task, a scalar.

    Cross-entropy over classes (``task == "multiclass"``, TU), binary
    cross-entropy on each task's logit (``"binary"``, OGB) or squared
    error (``"regression"``, OGB); the last two over the labelled entries
    only (NaN labels masked, as OGB's examples do).

    Parameters
    ----------
    dataset : GraphDataset
        Gives ``task``.
    out : torch.Tensor
        Model output, ``(num_graphs, num_classes)``.
    labels : torch.Tensor
        ``(num_graphs,)`` classes or ``(num_graphs, num_tasks)`` values, on
        ``out``'s device.
    """
    if dataset.task == "multiclass":
        return F.cross_entropy(out, labels)
    labelled = ~torch.isnan(labels)
    if not bool(labelled.any()):
        return out.sum() * 0.0
    if dataset.task == "binary":
        return F.binary_cross_entropy_with_logits(out[labelled],
                                                  labels[labelled])
    return F.mse_loss(out[labelled], labels[labelled])


def score(dataset, out, labels) -> float:
    """Accuracy, or OGB's Evaluator's metric on the raw outputs (logits
    of each task, or the regressed values)."""
    if dataset.evaluator is None:
        if labels.numel() == 0:
            return 0.0
        return float((out.argmax(-1) == labels).double().mean())
    return float(dataset.evaluator.eval(
        {"y_true": labels, "y_pred": out})[dataset.metric])


def selection_sign(metric: str) -> float:
    """+1 where a higher ``metric`` is better, -1 where lower is (RMSE)."""
    return -1.0 if metric in LOWER_IS_BETTER else 1.0


@torch.no_grad()
def evaluate(model, dataset, ids, device, batch_size=512) -> dict:
    """Loss and metric of ``model`` on the graphs ``ids`` (eval mode).

    Returns
    -------
    dict
        ``loss`` (mean `task_loss`) and ``metric`` (accuracy or OGB's).
    """
    model.eval()
    outs, labels = [], []
    for start in range(0, len(ids), batch_size):
        graph, feat, y = dataset.batch(ids[start:start + batch_size])
        outs.append(model(graph, feat.to(device)).cpu())
        labels.append(y)
    if not outs:
        return {"loss": 0.0, "metric": 0.0}
    outs, labels = torch.cat(outs), torch.cat(labels)
    return {"loss": float(task_loss(dataset, outs, labels)),
            "metric": score(dataset, outs, labels)}


_ALIGN_BYTES = 64  # PyTorch's CPU allocator's alignment


def flat_parameters(model: torch.nn.Module) -> torch.nn.Parameter:
    """``model``'s parameters as views of one, for one optimizer update.

    PyTorch 2.2's Adam costs some 60 us per parameter tensor and step on
    the CPU (for-loop and ``foreach`` alike): 2.9 ms of HAP's 48 tensors,
    a tenth of its step at batch 32. Over one flat parameter it is one
    update of the same elementwise math (the same bits, as long as every
    parameter gets a gradient each step, as every pooling model's does).
    Each parameter and its gradient become views of the flat parameter
    and its gradient, each starting 64-byte aligned as a tensor of its own
    would (GEMM kernels round by alignment on AVX-512; the gaps stay
    zero), which backward accumulates into in place; zero it
    with ``flat.grad.zero_()`` (setting it to None would end the views).
    Call after moving the model to its device.

    Returns
    -------
    torch.nn.Parameter
        The flat parameter, its gradient zero.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    kinds = {(p.dtype, p.device) for p in params}
    if len(kinds) != 1:
        raise ValueError(f"flat_parameters needs one dtype and device; got "
                         f"{sorted(map(str, kinds))}")
    # Each view starts 64-byte aligned, as a tensor of its own would:
    # vectorised kernels (MKL's GEMM on AVX-512) round by alignment.
    step = max(1, _ALIGN_BYTES // params[0].element_size())
    starts, end = [], 0
    for p in params:
        starts.append(end)
        end += -(-p.numel() // step) * step
    flat = torch.nn.Parameter(params[0].new_zeros(end))
    flat.grad = torch.zeros_like(flat)
    for p, start in zip(params, starts, strict=True):
        flat.data[start:start + p.numel()] = p.detach().reshape(-1)
        p.data = flat.data[start:start + p.numel()].view_as(p)
        p.grad = flat.grad[start:start + p.numel()].view_as(p)
    return flat


def build_model(config, dataset) -> torch.nn.Module:
    """The pooling model ``config`` asks for, sized for ``dataset``."""
    # Lazy: the pooling models load DGL, which `import hmgraph.classify`
    # (and so the CLI's parser) does not need.
    from hmgraph.models.pooling import build_pooling_model

    return build_pooling_model(
        config.model, dataset.feat_dim, config.hidden, dataset.num_classes,
        num_levels=config.levels, dropout=config.dropout, ratio=config.ratio,
        max_nodes=dataset.max_nodes)


def check_model_memory(config, dataset) -> int:
    """Refuse a model whose training state does not fit the device's free
    memory, before a fold trains (see `hmgraph.memory.check_model_memory`).

    Returns
    -------
    int
        Bytes of training state.

    Raises
    ------
    ValueError
        ``--hidden 100000000: training the model needs ...; use a smaller
        --hidden`` (``--hidden`` and ``--levels``, which size the model).
    """
    return check_training_memory(
        lambda: build_model(config, dataset), config.device,
        {"--hidden": config.hidden, "--levels": config.levels})


class TargetScale(torch.nn.Module):
    """A regressor whose outputs are ``model(...) * std + mean``.

    The model learns standardised targets (its head starts near 0, the
    training targets' mean), while the loss, the selection and OGB's
    Evaluator all see values in the targets' own units. ``mean`` and
    ``std`` (per task, from the training graphs' labelled values) are
    buffers, saved with the weights.
    """

    def __init__(self, model, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.model = model
        self.register_buffer("mean", mean.float())
        self.register_buffer("std", std.float())

    def forward(self, graph, feat):
        """See the wrapped model's ``forward``; outputs rescaled."""
        return self.model(graph, feat) * self.std + self.mean

    @property
    def auxiliary_loss(self):
        """The wrapped model's ``auxiliary_loss``."""
        return self.model.auxiliary_loss


def target_scale(dataset, train_ids) -> tuple:
    """Per task, the mean and std (1 where 0 or unknown) of the labelled
    training targets of a regression ``dataset``."""
    y = dataset.labels[train_ids].double()
    seen = ~torch.isnan(y)
    count = seen.sum(0).clamp(min=1)
    mean = torch.where(seen, y, 0.0).sum(0) / count
    var = torch.where(seen, (y - mean) ** 2, 0.0).sum(0) / count
    std = var.sqrt()
    return mean, torch.where(std > 0, std, torch.ones_like(std))


class Ensemble(torch.nn.Module):
    """The mean prediction of ``models``, as one model's outputs.

    Multiclass: the log of the mean class probabilities (logits whose
    softmax is that mean); binary: the logit of the mean probability;
    regression: the mean value. `evaluate` scores it as any model.
    """

    def __init__(self, models, task: str):
        super().__init__()
        self.members = torch.nn.ModuleList(models)
        self.task = task

    def forward(self, graph, feat):
        """The members' outputs, averaged as the task's predictions."""
        outs = torch.stack([m(graph, feat) for m in self.members])
        if self.task == "multiclass":
            return torch.softmax(outs, -1).mean(0).clamp_min(1e-12).log()
        if self.task == "binary":
            return torch.logit(torch.sigmoid(outs).mean(0), eps=1e-7)
        return outs.mean(0)


class Trainer:
    """One model, its flat Adam and its training graphs; `epoch` trains
    one epoch of mini-batches in the order seeded with ``seed + epoch``.
    A regressor learns standardised targets (`TargetScale`)."""

    def __init__(self, config, dataset, train_ids, seed, device):
        torch.manual_seed(seed)
        self.config, self.dataset, self.device = config, dataset, device
        self.train_ids, self.seed = train_ids, seed
        self.model = build_model(config, dataset)
        if dataset.task == "regression":
            self.model = TargetScale(self.model,
                                     *target_scale(dataset, train_ids))
        self.model = self.model.to(device)
        self.flat = flat_parameters(self.model)
        self.optimizer = torch.optim.Adam([self.flat], lr=config.lr,
                                          weight_decay=config.weight_decay)

    def epoch(self, epoch: int) -> float:
        """Train one epoch; returns the mean training loss."""
        config, model, ids = self.config, self.model, self.train_ids
        model.train()
        order = torch.randperm(len(ids), generator=torch.Generator()
                               .manual_seed(self.seed + epoch))
        total, count = 0.0, 0
        # A last batch of one graph joins the one before: a graph of one
        # node would be a batch-norm batch of one (ogbg-molfreesolv's
        # 513 training graphs at batch 128 end on methane).
        starts = list(range(0, len(order), config.batch_size))
        if len(starts) > 1 and len(order) - starts[-1] == 1:
            starts.pop()
        for i, j in zip(starts, starts[1:] + [len(order)], strict=True):
            graph, feat, y = self.dataset.batch(ids[order[i:j]])
            out = model(graph, feat.to(self.device))
            loss = task_loss(self.dataset, out, y.to(self.device)) \
                + model.auxiliary_loss
            self.flat.grad.zero_()
            loss.backward()
            if config.clip > 0:
                torch.nn.utils.clip_grad_norm_([self.flat], config.clip)
            self.optimizer.step()
            total += float(loss) * len(y)
            count += len(y)
        return total / max(count, 1)


