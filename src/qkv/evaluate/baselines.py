"""Baselines that a Transformer must beat, on the same splits (scikit-learn logistic regression:
the ``probe`` extra, imported when a baseline is fitted).

Sequence tasks: amino-acid composition of the whole sequence and of its first 20 residues (where
targeting signals such as signal peptides sit) + log length, 42 features; classes weighted
inversely to their frequency. (Chosen on SignalP validation: whole-sequence composition alone
gave MCC 0.19, with the N-terminal window 0.54.)
Residue tasks: one-hot window of ±7 residues around each position (15 × 21 features, the
21st symbol marking "outside the chain"), the classic secondary-structure baseline (Qian &
Sejnowski 1988 used a ±6 window).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence

import numpy as np

from ..data.protein_tasks import ProteinTask
from ..data.tokenizers import AMINO_ACIDS
from ..extras import require
from .classification import classification_metrics

logger = logging.getLogger(__name__)

_INDEX = {a: i for i, a in enumerate(AMINO_ACIDS)}  # rare codes (X B Z U O) count as none


def composition(sequence: str) -> np.ndarray:
    """``(21,)`` float: frequency of each standard residue, then log(length)."""
    counts = np.zeros(len(AMINO_ACIDS) + 1)
    for c in sequence:
        if c in _INDEX:
            counts[_INDEX[c]] += 1
    counts[:-1] /= max(len(sequence), 1)
    counts[-1] = np.log(max(len(sequence), 1))
    return counts


def window_features(sequence: str, half: int = 7):
    """``(L, (2·half+1)·21)`` sparse one-hot windows centred on each residue (a SciPy CSR
    matrix; SciPy comes with scikit-learn).

    Raises:
        MissingExtra: scikit-learn is not installed (``pip install 'qkv[probe]'``).
    """
    require("probe", "building the baseline's residue windows")
    from scipy.sparse import csr_matrix

    width, n = 2 * half + 1, len(AMINO_ACIDS) + 1
    codes = np.array([_INDEX.get(c, n - 1) for c in sequence])
    padded = np.concatenate([np.full(half, n - 1), codes, np.full(half, n - 1)])
    cols = np.stack([padded[i : i + len(sequence)] + i * n for i in range(width)], 1)  # (L, width)
    rows = np.repeat(np.arange(len(sequence)), width)
    return csr_matrix((np.ones(rows.size), (rows, cols.ravel())), shape=(len(sequence), width * n))


N_TERMINAL = 20


def composition_features(sequence: str) -> np.ndarray:
    """``(42,)``: :func:`composition` of the whole sequence, then of its first 20 residues."""
    return np.concatenate([composition(sequence), composition(sequence[:N_TERMINAL])])


def _fit_predict(x_train, y_train, x_test, class_weight=None):
    require("probe", "the logistic-regression baseline")
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    scale = not hasattr(x_train, "tocsr")
    clf = LogisticRegression(max_iter=3000, C=1.0, class_weight=class_weight)
    model = make_pipeline(StandardScaler(), clf) if scale else clf
    model.fit(x_train, y_train)
    return model.predict_proba(x_test)


def baseline_metrics(
    task: ProteinTask, split: str = "test", max_train_residues: int = 300_000, seed: int = 0
) -> dict:
    """Fit the task's baseline on its train split; metrics on ``split``. Residue tasks use at
    most ``max_train_residues`` labelled training residues (a fixed random sample) to keep the
    fit to a minute or two on a laptop.

    Raises:
        MissingExtra: scikit-learn is not installed (``pip install 'qkv[probe]'``).
    """
    require("probe", "the logistic-regression baseline")
    from scipy.sparse import vstack

    train, test = task.split("train"), task.split(split)
    if task.level == "sequence":
        x_tr = np.stack([composition_features(r.sequence) for r in train])
        y_tr = np.array([task.label_ids(r)[0] for r in train])
        x_te = np.stack([composition_features(r.sequence) for r in test])
        y_te = np.array([task.label_ids(r)[0] for r in test])
        name = "amino-acid composition (whole + first 20 residues) + logistic regression"
    else:

        def stack(records):
            xs, ys = [], []
            for r in records:
                y = np.array(task.label_ids(r))
                keep = y != -100
                xs.append(window_features(r.sequence)[keep])
                ys.append(y[keep])
            return vstack(xs).tocsr(), np.concatenate(ys)

        x_tr, y_tr = stack(train)
        if x_tr.shape[0] > max_train_residues:
            pick = np.random.default_rng(seed).choice(x_tr.shape[0], max_train_residues, replace=False)
            x_tr, y_tr = x_tr[pick], y_tr[pick]
        x_te, y_te = stack(test)
        name = "±7-residue one-hot window + logistic regression"
    present = sorted(set(y_tr.tolist()))
    probs = np.zeros((x_te.shape[0], len(task.classes)))
    # Balanced weights help rare SignalP types; Q3 counts every residue, so no weights there.
    weights = "balanced" if task.level == "sequence" else None
    probs[:, present] = _fit_predict(x_tr, y_tr, x_te, weights)
    metrics = classification_metrics(y_te, probs.argmax(1), probs, task.classes)
    metrics["baseline"] = name
    return metrics


def pixel_baseline_metrics(
    train_images: np.ndarray,
    train_labels: np.ndarray,
    test_images: np.ndarray,
    test_labels: np.ndarray,
    classes: Sequence[str],
    max_iter: int = 200,
) -> dict:
    """Logistic regression on raw pixels (scaled to [0, 1]; no standardisation, which only
    amplifies the noise of near-constant border pixels), fitted on the training images:
    the baseline a ViT must beat. Images uint8 ``(N, H, W, C)``; metrics on the test images.

    Raises:
        MissingExtra: scikit-learn is not installed (``pip install 'qkv[probe]'``).
    """
    require("probe", "the pixel baseline")
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    x_tr = train_images.reshape(len(train_images), -1) / 255.0
    x_te = test_images.reshape(len(test_images), -1) / 255.0
    clf = LogisticRegression(max_iter=max_iter, C=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        clf.fit(x_tr, train_labels)
    if any(issubclass(w.category, ConvergenceWarning) for w in caught):
        # sklearn's own warning is a paragraph; the baseline is by design what max_iter reaches
        logger.info(f"pixel baseline: L-BFGS stopped at max_iter={max_iter} before converging")
    probs = np.zeros((len(x_te), len(classes)))
    probs[:, clf.classes_] = clf.predict_proba(x_te)
    metrics = classification_metrics(test_labels, probs.argmax(1), probs, classes)
    metrics["baseline"] = "logistic regression on pixels"
    return metrics


def tfidf_baseline_metrics(
    train_texts: list[str],
    train_labels: list[int],
    test_texts: list[str],
    test_labels: list[int],
    classes: Sequence[str],
) -> dict:
    """TF-IDF of word uni- and bigrams (sublinear term frequency) + logistic regression, fitted
    on the training texts: the classical text-classification baseline (≈ 0.80 on SST-2) a
    pretrained Transformer must beat. Metrics on the test texts.

    Raises:
        MissingExtra: scikit-learn is not installed (``pip install 'qkv[probe]'``).
    """
    require("probe", "the TF-IDF baseline")
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2)
    x_tr = vectorizer.fit_transform(train_texts)
    clf = LogisticRegression(max_iter=2000, C=1.0).fit(x_tr, train_labels)
    probs = np.zeros((len(test_texts), len(classes)))
    probs[:, clf.classes_] = clf.predict_proba(vectorizer.transform(test_texts))
    metrics = classification_metrics(test_labels, probs.argmax(1), probs, classes)
    metrics["baseline"] = "TF-IDF (word 1-2-grams) + logistic regression"
    return metrics
