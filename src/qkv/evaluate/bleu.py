"""Translation metrics through sacreBLEU (Post 2018): BLEU on detokenized text, cased and
lowercased, and chrF; between protein sequences, the residues recovered (Biopython's aligner:
the ``proteins`` extra, imported when first used)."""

from __future__ import annotations

import sacrebleu

from ..extras import require


def translation_scores(hypotheses: list[str], references: list[str]) -> dict:
    """``{"bleu", "bleu_lowercase", "chrf", "exact"}`` (each 0-100) of detokenized hypotheses vs
    references: corpus BLEU (Papineni et al. 2002) cased and lowercased, corpus chrF (Popović
    2015; character 6-grams, so a one-word or one-chain target still has n-grams to match, where
    BLEU's 2- to 4-grams of words find none and score 0), and exact match: the percentage of
    hypotheses equal to their reference (outer whitespace aside).

    Raises:
        ValueError: as many hypotheses as references are needed.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    refs = [references]
    same = sum(h.strip() == r.strip() for h, r in zip(hypotheses, references, strict=True))
    return {
        "bleu": sacrebleu.corpus_bleu(hypotheses, refs).score,
        "bleu_lowercase": sacrebleu.corpus_bleu(hypotheses, refs, lowercase=True).score,
        "chrf": sacrebleu.corpus_chrf(hypotheses, refs).score,
        "exact": 100.0 * same / max(len(references), 1),
    }


def bleu_signature() -> str:
    """sacreBLEU's signature of the default BLEU settings (for reports)."""
    return str(sacrebleu.BLEU().get_signature())


def residue_recovery(hypotheses: list[str], references: list[str]) -> float:
    """Mean fraction of each reference's residues that a generated sequence recovers: the
    identical positions of a global alignment (Needleman-Wunsch with Biopython's
    ``PairwiseAligner``: match 1, mismatch 0, gaps opened at -1 and extended at -0.5, so that a
    length difference costs a gap rather than shifting every residue) over the reference's
    length. The field's "amino-acid recovery" for designed or generated chains (e.g. the light
    chain given the heavy one); 1.0 only for an exact copy. An empty hypothesis recovers 0.

    Raises:
        ValueError: different numbers of hypotheses and references, or an empty reference.
        MissingExtra: Biopython is not installed (``pip install 'qkv[proteins]'``).
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    aligner = residue_aligner()
    total = 0.0
    for hyp, ref in zip(hypotheses, references, strict=True):
        if not ref:
            raise ValueError("an empty reference has no residues to recover")
        if hyp:
            counts = aligner.align(hyp, ref)[0].counts()
            total += counts.identities / len(ref)
    return total / len(references)


def residue_aligner():
    """The global aligner of :func:`residue_recovery` (Biopython's ``PairwiseAligner``, match
    1, mismatch 0, gap open -1, extend -0.5): its ``score`` is also what nearest-sequence
    lookups rank by.

    Raises:
        MissingExtra: Biopython is not installed (``pip install 'qkv[proteins]'``).
    """
    require("proteins", "aligning protein sequences")
    from Bio.Align import PairwiseAligner

    aligner = PairwiseAligner(mode="global", match_score=1.0, mismatch_score=0.0)
    aligner.open_gap_score, aligner.extend_gap_score = -1.0, -0.5
    return aligner
