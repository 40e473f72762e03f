"""Evaluation metrics of the node-classification tasks, in torch (no scikit-learn needed).

``evaluate(metric, logits, label, mask)`` is the single entry point; the metric names are
those of :attr:`GraphData.metric <dgl_rsc.data.graphdata.GraphData>`.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["evaluate", "accuracy", "rocauc", "f1_micro", "binary_rocauc"]


def evaluate(
    metric: str,
    logits: torch.Tensor,
    label: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
) -> float:
    """Score predictions on the nodes selected by ``mask``.

    Args:
        metric: ``"accuracy"``, ``"rocauc"`` or ``"f1_micro"``.
        logits: ``(N, C)`` logits or scores; for a binary task also ``(N,)`` or ``(N, 1)``
            scores of the positive class.
        label: ``(N,)`` int class ids or ``(N, C)`` 0/1 multilabel targets.
        mask: ``(N,)`` bool, or int node ids; ``None`` scores every node.

    Returns:
        The metric as a Python float in ``[0, 1]``.

    Example:
        >>> logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0]])
        >>> evaluate("accuracy", logits, torch.tensor([0, 1, 1]))
        0.6666666666666666
    """
    if metric not in _METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {sorted(_METRICS)}.")
    if logits.shape[0] != label.shape[0]:
        raise ValueError(f"logits have {logits.shape[0]} rows but label has {label.shape[0]}.")
    if mask is not None:
        mask = mask.to(logits.device)
        logits, label = logits[mask], label[mask]
    return _METRICS[metric](logits.detach(), label.to(logits.device))


def accuracy(logits: torch.Tensor, label: torch.Tensor) -> float:
    """Fraction of rows whose ``argmax`` over ``logits (N, C)`` equals ``label (N,)``."""
    if logits.dim() != 2 or label.dim() != 1:
        raise ValueError(
            f"accuracy needs logits (N, C) and label (N,), got "
            f"{tuple(logits.shape)} and {tuple(label.shape)}."
        )
    if label.numel() == 0:
        raise ValueError("accuracy of an empty selection is undefined (empty mask?).")
    return int((logits.argmax(dim=1) == label).sum()) / label.numel()


def rocauc(scores: torch.Tensor, label: torch.Tensor) -> float:
    """ROC-AUC: binary (``label (N,)`` 0/1) or the mean over tasks (``label (N, C)``).

    Binary scores may be ``(N,)``, ``(N, 1)`` or two-class logits ``(N, 2)`` (ranked by
    ``logit_1 - logit_0``, which orders nodes as the softmax probability of class 1 does).
    Multilabel tasks where the selection holds only one class are skipped, as OGB does.
    """
    if label.dim() == 1:
        if scores.dim() == 2 and scores.shape[1] == 2:
            scores = scores[:, 1] - scores[:, 0]
        return binary_rocauc(scores.reshape(-1), label)
    if scores.shape != label.shape:
        raise ValueError(
            f"multilabel scores {tuple(scores.shape)} and label "
            f"{tuple(label.shape)} differ in shape."
        )
    aucs = [
        binary_rocauc(scores[:, t], label[:, t])
        for t in range(label.shape[1])
        if 0 < int((label[:, t] == 1).sum()) < label.shape[0]
    ]
    if not aucs:
        raise ValueError("ROC-AUC is undefined: no task has both classes in the selection.")
    return sum(aucs) / len(aucs)


def binary_rocauc(scores: torch.Tensor, label: torch.Tensor) -> float:
    """ROC-AUC of ``scores (N,)`` for 0/1 ``label (N,)``; tied scores count one half.

    Computed as the Mann-Whitney statistic from the average ranks of the scores.
    """
    if scores.shape != label.shape or scores.dim() != 1:
        raise ValueError(
            f"scores {tuple(scores.shape)} and label {tuple(label.shape)} "
            "must be 1-D of equal length."
        )
    pos = label == 1
    n_pos = int(pos.sum())
    n_neg = label.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError(
            f"ROC-AUC needs both classes; got {n_pos} positives and {n_neg} " "negatives."
        )
    sorted_scores, order = torch.sort(scores.double())
    _, inverse, counts = torch.unique_consecutive(
        sorted_scores, return_inverse=True, return_counts=True
    )
    ends = torch.cumsum(counts, 0).double()
    ranks = (ends - (counts.double() - 1) / 2)[inverse]  # 1-based, ties get the mean rank
    rank_sum = float(ranks[pos[order]].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def f1_micro(logits: torch.Tensor, label: torch.Tensor) -> float:
    """Micro-averaged F1.

    Multilabel (``label (N, C)`` 0/1): a task is predicted positive where its logit is
    ``> 0``, and ``F1 = 2 TP / (2 TP + FP + FN)`` over all (node, task) pairs. Multiclass
    (``label (N,)``): micro F1 equals accuracy.
    """
    if label.dim() == 1:
        return accuracy(logits, label)
    if logits.shape != label.shape:
        raise ValueError(
            f"multilabel logits {tuple(logits.shape)} and label "
            f"{tuple(label.shape)} differ in shape."
        )
    pred, true = logits > 0, label > 0.5
    tp = int((pred & true).sum())
    wrong = int((pred != true).sum())  # FP + FN
    if tp == 0 and wrong == 0:
        return 1.0  # nothing to find and nothing predicted
    return 2 * tp / (2 * tp + wrong)


_METRICS = {"accuracy": accuracy, "rocauc": rocauc, "f1_micro": f1_micro}
