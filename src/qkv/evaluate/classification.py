"""Classification metrics (scikit-learn: the ``probe`` extra) and the confusion-matrix picture
(matplotlib: the ``plot`` extra); each is imported when first used.

Accuracy; Matthews correlation coefficient (multi-class: Gorodkin 2004, the R_K statistic,
``sklearn.metrics.matthews_corrcoef``); per-class precision/recall/F1; AUROC for two classes;
Q3 (per-residue accuracy over H/E/C) for secondary structure.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ..extras import require
from ..files import atomic_write


def classification_metrics(
    y_true: npt.ArrayLike, y_pred: npt.ArrayLike, probs: np.ndarray, classes: Sequence[str]
) -> dict:
    """Metrics of one evaluation.

    Args:
        y_true, y_pred: ``(N,)`` int class ids. probs: ``(N, C)`` float probabilities.
        classes: the ``C`` class names.

    Returns:
        ``accuracy``, ``mcc``, ``macro_f1`` (unweighted mean of the classes' F1),
        ``per_class`` {name: precision, recall (the class's accuracy), f1, support},
        ``auroc`` and ``auprc`` (two classes only, scored by the probability of class 1; AUPRC is
        average precision, the area under the precision-recall curve), ``n``, ``confusion``
        (C×C list, rows = true).

    Raises:
        MissingExtra: scikit-learn is not installed (``pip install 'qkv[probe]'``).
    """
    require("probe", "computing classification metrics")
    from sklearn.metrics import (
        accuracy_score,
        average_precision_score,
        confusion_matrix,
        matthews_corrcoef,
        precision_recall_fscore_support,
        roc_auc_score,
    )

    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    labels = list(range(len(classes)))
    p, r, f, s = precision_recall_fscore_support(y_true, y_pred, labels=labels, zero_division=0)
    out = {
        "n": int(len(y_true)),
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "mcc": float(matthews_corrcoef(y_true, y_pred)),
        "macro_f1": float(np.mean(f)),
        "per_class": {
            c: {"precision": float(p[i]), "recall": float(r[i]), "f1": float(f[i]), "support": int(s[i])}
            for i, c in enumerate(classes)
        },
        "confusion": confusion_matrix(y_true, y_pred, labels=labels).tolist(),
    }
    if len(classes) == 2 and len(set(y_true.tolist())) == 2:
        out["auroc"] = float(roc_auc_score(y_true, np.asarray(probs)[:, 1]))
        out["auprc"] = float(average_precision_score(y_true, np.asarray(probs)[:, 1]))
    return out


def per_group_binary_mcc(
    y_true: npt.ArrayLike, y_pred: npt.ArrayLike, groups: npt.ArrayLike, classes: Sequence[str], negative: str
) -> dict:
    """MCC of "class T" vs "not T" for every positive class T and every group (e.g. SignalP
    type per kingdom, SignalP 6.0's MCC2), plus "any positive class" vs ``negative``.
    Groups or classes without a true positive are left out.

    Raises:
        MissingExtra: scikit-learn is not installed (``pip install 'qkv[probe]'``).
    """
    require("probe", "computing classification metrics")
    from sklearn.metrics import matthews_corrcoef

    y_true, y_pred, groups = np.asarray(y_true), np.asarray(y_pred), np.asarray(groups)
    neg = classes.index(negative)
    out = {}
    for g in sorted(set(groups.tolist())):
        sel = groups == g
        t, p = y_true[sel], y_pred[sel]
        row = {"n": int(sel.sum()), "any_vs_" + negative: float(matthews_corrcoef(t != neg, p != neg))}
        for i, c in enumerate(classes):
            if i != neg and (t == i).any():
                row[c] = float(matthews_corrcoef(t == i, p == i))
        out[g] = row
    return out


def plot_confusion(confusion: npt.ArrayLike, classes: Sequence[str], path: Path, title: str) -> None:
    """Write a confusion-matrix PNG (rows = true class, columns = predicted; counts and
    row-normalised shading), atomically.

    Raises:
        MissingExtra: matplotlib is not installed (``pip install 'qkv[plot]'``).
    """
    require("plot", "drawing the confusion matrix")
    from matplotlib.figure import Figure  # the object API: no pyplot, no backend chosen

    cm = np.asarray(confusion, dtype=float)
    norm = cm / np.maximum(cm.sum(1, keepdims=True), 1)
    size = 1.2 + 0.6 * len(classes)
    fig = Figure(figsize=(size + 1, size))
    ax = fig.subplots()
    im = ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(classes)), classes, rotation=45, ha="right")
    ax.set_yticks(range(len(classes)), classes)
    for i in range(len(classes)):
        for j in range(len(classes)):
            ax.text(
                j,
                i,
                f"{int(cm[i, j])}",
                ha="center",
                va="center",
                color="white" if norm[i, j] > 0.5 else "black",
                fontsize=8,
            )
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="share of true class")
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
