"""Contact prediction from attention: Rao et al. 2021 ("Transformer protein language models are
unsupervised structure learners", ICLR), as ESM's ``ContactPredictionHead`` computes it.

Every layer's every head gives one ``(L, L)`` attention map over the residues (the rows and
columns of ``<cls>`` and ``<eos>`` dropped). Each map is symmetrised (``A + Aᵀ``) and corrected
for its background by the average product correction (APC, Dunn et al. 2008, Bioinformatics):
``F = A - a_i a_j / a``, with ``a_i``, ``a_j`` the row and column sums and ``a`` the total. The
``n_layers * n_heads`` corrected maps are the features of each residue pair; a logistic
regression over them (:class:`ContactHead`) gives the probability that the two residues' Cβ atoms
are within 8 Å. Its weights come from a converted checkpoint (ESM-2 ships one) or are fitted on a
few structures (:func:`fit_contact_head`; Rao et al. fit on 20).

Sequences longer than the model's width ``W`` (``max_len - 2`` residues): overlapping windows of
``W`` residues, each starting half a window after the one before (the last one ends at the
chain's end), each a separate forward pass with its own APC; a pair's features are the average
over the windows that hold both residues. A pair inside one window gets exactly that window's
features. Pairs that share no window (more than about ``W / 2`` apart) have no features: their
probability is 0 (they are never predicted as contacts).
"""

from __future__ import annotations

import inspect
import json
import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..errors import QkvError
from ..extras import require
from ..files import atomic_write, read_safetensors

if TYPE_CHECKING:
    from ..data.structures import Chain
    from .protein import ProteinEncoder

__all__ = [
    "ContactHead",
    "apc",
    "attention_features",
    "contact_precision",
    "contact_regression",
    "evaluate_contacts",
    "find_contact_head",
    "fit_contact_head",
    "mean_precision",
    "predict_contacts",
    "symmetrize",
    "window_starts",
]

logger = logging.getLogger(__name__)

HEAD_FORMAT = "qkv-contact-head"
CHECKPOINT_HEAD = "esm.contact_head."  # where HF ESM (and qkv's fair-esm import) keeps the regression
FIT_MIN_SEPARATION = 6  # Rao et al. 2021: pairs closer in sequence are left out of the fit
LONG_RANGE = 24  # |i - j| >= 24: long-range contacts, the usual precision report (CASP)
TOPS = ("L", "L/2", "L/5")


def symmetrize(x: torch.Tensor) -> torch.Tensor:
    """``x + xᵀ`` over the last two dimensions (ESM's ``symmetrize``).

    Shape: ``(..., L, L)`` → ``(..., L, L)``."""
    return x + x.transpose(-1, -2)


def apc(x: torch.Tensor) -> torch.Tensor:
    """Average product correction (Dunn et al. 2008; as Rao et al. 2021 and ESM apply it):
    ``x_ij - (Σ_k x_ik)(Σ_k x_kj) / Σ_kl x_kl``, per map over the last two dimensions.

    Shape: ``(..., L, L)`` → ``(..., L, L)``."""
    row = x.sum(-1, keepdim=True)  # (..., L, 1)
    col = x.sum(-2, keepdim=True)  # (..., 1, L)
    total = x.sum((-1, -2), keepdim=True)  # (..., 1, 1)
    return x - row * col / total


def window_starts(length: int, width: int) -> list[int]:
    """First residue (0-based) of each window over a chain of ``length`` residues: one window
    when it fits in ``width``, else starts ``0, width // 2, ...`` and a last one that ends at the
    chain's end."""
    if length <= width:
        return [0]
    stride = max(1, width // 2)
    return [*range(0, length - width, stride), length - width]


def _window_maps(encoder: ProteinEncoder, ids: list[int], start: int) -> torch.Tensor:
    """Symmetrised, APC-corrected attention maps of the residues ``ids[start : start + W]``,
    read in one forward pass framed by ``<cls>``/``<eos>``. Shape: ``(n_layers * n_heads, w, w)``
    float32 on the CPU (w = the window's residues)."""
    window = ids[start : start + encoder.width]
    tokens = torch.tensor([[encoder.tok.cls_id, *window, encoder.tok.eos_id]], device=encoder.device)
    _, _, weights = encoder.model.encode(tokens, need_weights=True)
    maps = torch.stack(weights, 1)[0].float()  # (n_layers, H, T, T)
    maps = maps[..., 1:-1, 1:-1].flatten(0, 1)  # (n_layers * H, w, w): <cls>, <eos> dropped
    return apc(symmetrize(maps)).cpu()


@torch.no_grad()
def attention_features(
    encoder: ProteinEncoder, sequence: str, seq_id: str = "sequence"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Features of every residue pair of one sequence: its symmetrised, APC-corrected attention
    maps, one per layer and head (index ``layer * n_heads + head``), averaged over the windows
    that hold both residues (see the module docstring).

    Returns:
        ``(features (L, L, n_layers * n_heads) float32, covered (L, L) bool)``; ``covered`` is
        False (and the features 0) for pairs that share no window.

    Raises:
        QkvError: an empty sequence or a character that is not an amino-acid code (naming
            ``seq_id`` and the position).
    """
    ids = encoder.tok.encode(sequence, seq_id, add_special_tokens=False)
    if not ids:
        raise QkvError(f"{seq_id}: empty sequence")
    length, starts = len(ids), window_starts(len(ids), encoder.width)
    if len(starts) == 1:
        features = _window_maps(encoder, ids, 0).permute(1, 2, 0).contiguous()  # (L, L, F)
        return features, torch.ones(length, length, dtype=torch.bool)
    cfg = encoder.model.config
    sums = torch.zeros(length, length, cfg.n_layers * cfg.n_heads)
    counts = torch.zeros(length, length)
    for s in starts:
        maps = _window_maps(encoder, ids, s).permute(1, 2, 0)  # (w, w, F)
        w = maps.shape[0]
        sums[s : s + w, s : s + w] += maps
        counts[s : s + w, s : s + w] += 1
    covered = counts > 0
    return sums / counts.clamp(min=1).unsqueeze(-1), covered


@dataclass
class ContactHead:
    """Logistic regression from a pair's attention features to its contact probability
    (Rao et al. 2021; ESM's ``ContactPredictionHead.regression``).

    ``weight`` ``(n_layers * n_heads,)`` float32 (index ``layer * n_heads + head``), ``bias``
    ``()`` float32, the ``n_layers`` and ``n_heads`` of the model it belongs to, ``model``: which
    model (a path or name, for the record), ``info``: how it was made (kept in the file).
    """

    weight: torch.Tensor
    bias: torch.Tensor
    n_layers: int
    n_heads: int
    model: str = ""
    info: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.weight = self.weight.detach().float().reshape(-1).cpu()
        self.bias = self.bias.detach().float().reshape(()).cpu()
        if self.weight.numel() != self.n_layers * self.n_heads:
            raise QkvError(
                f"a contact head of {self.weight.numel()} weights does not fit {self.n_layers} layers × "
                f"{self.n_heads} heads"
            )

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """``features`` ``(L, L, n_layers * n_heads)`` → logits ``(L, L)``."""
        return features.float() @ self.weight + self.bias

    def probabilities(self, features: torch.Tensor, covered: torch.Tensor | None = None) -> torch.Tensor:
        """Contact probabilities ``(L, L)`` float32 from ``features`` ``(L, L, n_layers * n_heads)``;
        0 where ``covered`` ``(L, L)`` bool is False (pairs that share no window)."""
        probs = torch.sigmoid(self.logits(features))
        return probs if covered is None else probs.masked_fill(~covered, 0.0)

    def check_fits(self, encoder: ProteinEncoder, where: str = "the contact head") -> None:
        """Raise :class:`QkvError` when the encoder has other numbers of layers or heads."""
        cfg = encoder.model.config
        if (cfg.n_layers, cfg.n_heads) != (self.n_layers, self.n_heads):
            raise QkvError(
                f"{where} was made for a model of {self.n_layers} layers × {self.n_heads} heads"
                f"{f' ({self.model})' if self.model else ''}; this model has {cfg.n_layers} × {cfg.n_heads}"
            )

    @classmethod
    def from_state(
        cls,
        state: dict[str, torch.Tensor],
        n_layers: int,
        n_heads: int,
        model: str = "",
        prefix: str = CHECKPOINT_HEAD,
    ) -> ContactHead | None:
        """The head in a checkpoint's tensors (``<prefix>regression.weight`` ``(1, F)`` and
        ``.bias`` ``(1,)``, ESM's names), or ``None`` when it has none.

        Raises:
            QkvError: a weight whose size is not ``n_layers * n_heads``.
        """
        weight, bias = state.get(prefix + "regression.weight"), state.get(prefix + "regression.bias")
        if weight is None:
            return None
        bias = torch.zeros(()) if bias is None else bias
        return cls(weight, bias, n_layers, n_heads, model, {"source": "the checkpoint's own contact head"})

    def save(self, path: str | Path) -> Path:
        """Write the head atomically as safetensors: ``regression.weight`` ``(1, F)`` and
        ``regression.bias`` ``(1,)`` (ESM's ``ContactPredictionHead`` names, so fair-esm's
        ``contact_head.load_state_dict`` reads it too), and in the metadata ``format``,
        ``model``, ``n_layers``, ``n_heads`` and ``info`` (JSON)."""
        from safetensors.torch import save_file

        path = Path(path)
        tensors = {
            "regression.weight": self.weight.reshape(1, -1).contiguous(),
            "regression.bias": self.bias.reshape(1).contiguous(),
        }
        metadata = {
            "format": HEAD_FORMAT,
            "model": self.model,
            "n_layers": str(self.n_layers),
            "n_heads": str(self.n_heads),
            "info": json.dumps(self.info, ensure_ascii=False),
        }
        atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))
        return path

    @classmethod
    def load(cls, path: str | Path) -> ContactHead:
        """Read a head written by :meth:`save`.

        Raises:
            QkvError: a missing, corrupt or foreign file (not a qkv contact head).
        """
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise QkvError(f"contact head not found: {path}")
        tensors = read_safetensors(path)
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        if meta.get("format") != HEAD_FORMAT or "regression.weight" not in tensors:
            raise QkvError(f"{path} is not a qkv contact head (written by `qkv contacts MODEL --fit`)")
        try:
            info = json.loads(meta.get("info", "{}"))
            return cls(
                tensors["regression.weight"],
                tensors.get("regression.bias", torch.zeros(())),
                int(meta["n_layers"]),
                int(meta["n_heads"]),
                meta.get("model", ""),
                info,
            )
        except (KeyError, ValueError) as exc:
            raise QkvError(f"{path}: damaged contact-head metadata ({exc})") from None


def predict_contacts(
    encoder: ProteinEncoder, head: ContactHead, sequence: str, seq_id: str = "sequence"
) -> torch.Tensor:
    """Contact probabilities ``(L, L)`` float32 of one sequence (0 for pairs that share no
    window). What ESM's ``predict_contacts`` returns, for any qkv protein encoder.

    Raises:
        QkvError: the head does not fit the model, or a bad sequence (see
            :func:`attention_features`).
    """
    head.check_fits(encoder)
    return head.probabilities(*attention_features(encoder, sequence, seq_id))


def _pairs(length: int, min_separation: int) -> tuple[np.ndarray, np.ndarray]:
    """Upper-triangle pairs ``(i, j)`` with ``j - i >= min_separation``, in row order."""
    return np.triu_indices(length, max(1, min_separation))


def contact_regression(C: float):
    """scikit-learn's L1-penalised logistic regression with the liblinear solver, in the
    spelling of the installed version (``penalty="l1"`` before 1.8, ``l1_ratio=1`` since).

    Raises:
        MissingExtra: scikit-learn is not installed (``pip install 'qkv[proteins]'``).
    """
    require("proteins", "fitting a contact head")
    from sklearn.linear_model import LogisticRegression

    deprecated = inspect.signature(LogisticRegression).parameters["penalty"].default == "deprecated"
    l1 = {"l1_ratio": 1.0} if deprecated else {"penalty": "l1"}
    return LogisticRegression(C=C, solver="liblinear", random_state=0, **l1)


def fit_contact_head(
    encoder: ProteinEncoder,
    chains: Sequence[Chain],
    model: str = "",
    C: float = 0.15,
    min_separation: int = FIT_MIN_SEPARATION,
) -> ContactHead:
    """Fit a :class:`ContactHead` on structures, as Rao et al. 2021 (Methods) fit ESM's:
    every pair ``i < j`` with ``j - i >= min_separation`` (6) of every chain is one example (its
    attention features; label: Cβ within 8 Å); an L1-penalised logistic regression, inverse
    strength ``C = 0.15``, solved by liblinear: the settings the ESM authors published for their
    heads.

    Classes are not re-weighted (about 1 pair in 30 is a contact): the ESM authors fitted without
    class weights, and the evaluation ranks pairs by probability (top-L precision), which needs a
    good ordering, not a calibrated 50 % threshold. The L1 penalty keeps a few heads.

    Memory: all pairs' features at once, ``Σ L²/2 × n_layers × n_heads`` float32 (the shared
    set's fit half has 730,000 pairs: 1.9 GB with ESM-2 650M's 660 maps), several times that
    inside liblinear (float64 values with their indices).

    Raises:
        QkvError: no chains, or chains without both contacts and non-contacts among their pairs;
            MissingExtra (one) where scikit-learn is not installed (``pip install 'qkv[proteins]'``).
    """
    if not chains:
        raise QkvError("no chains to fit a contact head on")
    require("proteins", "fitting a contact head")  # before the attention features are computed
    xs, ys = [], []
    for chain in chains:
        features, covered = attention_features(encoder, chain.sequence, chain.name)
        i, j = _pairs(len(chain.sequence), min_separation)
        keep = covered.numpy()[i, j]
        xs.append(features[torch.from_numpy(i[keep]), torch.from_numpy(j[keep])].numpy())
        ys.append(chain.contacts()[i[keep], j[keep]])
        logger.debug(f"{chain.name}: {keep.sum()} pairs, {ys[-1].sum()} contacts")
    x, y = np.concatenate(xs), np.concatenate(ys)
    if y.all() or not y.any():
        raise QkvError(
            f"the {len(chains)} fit chain(s) have {'only contacts' if y.any() else 'no contacts'} among "
            f"their pairs {min_separation} or more residues apart; a logistic regression needs both"
        )
    logger.info(
        f"fitting the contact head on {len(chains)} chains: {len(y):,} pairs ({int(y.sum()):,} contacts), "
        f"{x.shape[1]} attention maps"
    )
    from sklearn.exceptions import ConvergenceWarning

    clf = contact_regression(C)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        clf.fit(x, y)
    if any(issubclass(w.category, ConvergenceWarning) for w in caught):
        logger.warning(
            "the contact head's logistic regression stopped before converging (liblinear max_iter)"
        )
    cfg = encoder.model.config
    info = {
        "source": "fitted: L1 logistic regression on APC-corrected attention (Rao et al. 2021)",
        "C": str(C),
        "min_separation": str(min_separation),
        "chains": ",".join(c.name for c in chains),
        "pairs": str(len(y)),
        "nonzero_weights": str(int(np.count_nonzero(clf.coef_))),
    }
    return ContactHead(
        torch.from_numpy(clf.coef_[0].astype(np.float32)),
        torch.tensor(float(clf.intercept_[0])),
        cfg.n_layers,
        cfg.n_heads,
        model,
        info,
    )


def contact_precision(
    probs: torch.Tensor | np.ndarray,
    true_map: np.ndarray,
    min_separation: int = LONG_RANGE,
    top: Sequence[str] = TOPS,
) -> dict[str, float]:
    """Precision of the top-ranked pairs: of the pairs ``i < j`` with ``j - i >=
    min_separation`` (24: long range), the ``k`` with the highest probability (``"L"``:
    ``k = L``; ``"L/2"``, ``"L/5"``: ``L // 2``, ``L // 5``; at least 1, at most the number of
    such pairs; ties broken by position), and the fraction of them that are contacts. The
    measure of CASP and Rao et al. 2021.

    Args:
        probs: ``(L, L)`` contact probabilities (or any scores: only their order counts).
        true_map: ``(L, L)`` bool contacts.

    Returns:
        ``{"L": precision, "L/2": ..., "L/5": ...}`` (the keys of ``top``).

    Raises:
        QkvError: maps of different or non-square shapes, a ``top`` entry that is not ``L`` or
            ``L/n``, or a chain too short to have any pair that far apart.
    """
    scores = probs.detach().cpu().numpy() if isinstance(probs, torch.Tensor) else np.asarray(probs)
    truth = np.asarray(true_map, dtype=bool)
    if scores.ndim != 2 or scores.shape[0] != scores.shape[1] or scores.shape != truth.shape:
        raise QkvError(f"contact maps must be square and alike: {scores.shape} and {truth.shape}")
    length = scores.shape[0]
    i, j = _pairs(length, min_separation)
    if len(i) == 0:
        raise QkvError(f"a chain of {length} residues has no pair {min_separation} or more residues apart")
    order = np.argsort(-scores[i, j], kind="stable")
    hits = truth[i, j][order]
    out = {}
    for name in top:
        divisor = 1 if name == "L" else int(name[2:]) if name.startswith("L/") and name[2:].isdigit() else 0
        if divisor < 1:
            raise QkvError(f"top {name!r}: give L or L/n")
        k = min(max(1, length // divisor), len(hits))
        out[name] = float(hits[:k].mean())
    return out


def evaluate_contacts(
    encoder: ProteinEncoder, head: ContactHead, chains: Sequence[Chain], min_separation: int = LONG_RANGE
) -> list[dict]:
    """Per chain: ``{"chain": name, "length": L, "L": precision, "L/2": ..., "L/5": ...}``, the
    long-range top-L precisions of :func:`contact_precision`, in ``chains`` order."""
    rows = []
    for chain in chains:
        probs = predict_contacts(encoder, head, chain.sequence, chain.name)
        precision = contact_precision(probs, chain.contacts(), min_separation)
        rows.append({"chain": chain.name, "length": len(chain.sequence), **precision})
    return rows


def mean_precision(rows: list[dict], top: Sequence[str] = TOPS) -> dict[str, float]:
    """The mean over chains of each precision in ``rows`` (:func:`evaluate_contacts`)."""
    return {k: float(np.mean([r[k] for r in rows])) for k in top}


def _checkpoint_head(
    state: dict[str, torch.Tensor], encoder: ProteinEncoder, model: str
) -> ContactHead | None:
    """The contact head among a checkpoint's tensors (``esm.contact_head.regression.*``; a bare
    ``EsmModel``'s without the ``esm.`` prefix), for ``encoder``'s numbers of layers and heads,
    or ``None``."""
    cfg = encoder.model.config
    for prefix in (CHECKPOINT_HEAD, CHECKPOINT_HEAD.removeprefix("esm.")):
        found = ContactHead.from_state(state, cfg.n_layers, cfg.n_heads, model, prefix)
        if found is not None:
            return found
    return None


HEAD_FILE = "contact_head.safetensors"  # a fitted head's place in a run directory


def find_contact_head(
    model: str | Path, encoder: ProteinEncoder, head: str | Path | None = None, revision: str | None = None
) -> ContactHead:
    """The contact head to predict with for ``model`` (a run directory, HF folder, short or Hub
    name, as :meth:`ProteinEncoder.load` reads it): ``head`` (a file of :meth:`ContactHead.save`)
    when given; else the run directory's ``contact_head.safetensors``; else the checkpoint's own
    head (ESM-2's ``esm.contact_head.regression.*``: in a run directory's
    ``hf_extra.safetensors``, else in the HF folder's weights, or a fair-esm file's
    ``-contact-regression.pt``).

    Raises:
        QkvError: none of these exists (saying how to fit one), or a head made for other numbers
            of layers and heads.
    """
    from ..hub.convert import HF_EXTRA
    from ..hub.pretrained import checkpoint_tensors, is_run_dir

    path = Path(model)
    run_dir = path.is_dir() and is_run_dir(path)
    if head is not None:
        found: ContactHead | None = ContactHead.load(head)
        where = str(head)
    elif run_dir and (path / HEAD_FILE).is_file():
        found, where = ContactHead.load(path / HEAD_FILE), str(path / HEAD_FILE)
    elif run_dir:
        extra = path / HF_EXTRA
        found = _checkpoint_head(read_safetensors(extra), encoder, str(model)) if extra.is_file() else None
        where = f"{model}'s own contact head"
    else:
        found = _checkpoint_head(checkpoint_tensors(model, revision), encoder, str(model))
        where = f"{model}'s own contact head"
    if found is None:
        how = f"qkv contacts {model} --fit" + ("" if run_dir else " --head-out HEAD, then --head HEAD")
        raise QkvError(f"{model} has no contact head; fit one on structures with `{how}`")
    found.check_fits(encoder, where)
    return found
