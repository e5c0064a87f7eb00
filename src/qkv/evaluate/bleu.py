"""Translation metrics through sacreBLEU (Post 2018): BLEU on detokenized text, cased and
lowercased, and chrF."""

from __future__ import annotations

import sacrebleu


def translation_scores(hypotheses: list[str], references: list[str]) -> dict:
    """``{"bleu", "bleu_lowercase", "chrf"}`` (0-100) of detokenized hypotheses vs references."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    refs = [references]
    return {
        "bleu": sacrebleu.corpus_bleu(hypotheses, refs).score,
        "bleu_lowercase": sacrebleu.corpus_bleu(hypotheses, refs, lowercase=True).score,
        "chrf": sacrebleu.corpus_chrf(hypotheses, refs).score,
    }


def bleu_signature() -> str:
    """sacreBLEU's signature of the default BLEU settings (for reports)."""
    return str(sacrebleu.BLEU().get_signature())
