"""CDR-H3 infilling on held-out antibody heavy chains: qkv's masked diffusion LM against
AntiBERTy (one-shot masked-LM fill; Ruffolo et al. 2021, arXiv:2112.07782) and IgLM's own
infilling (Shuai et al., Cell Systems 2023), with a position-wise profile and chance.

    python benchmarks/cdr_h3_infill.py prepare OUT_DIR
    qkv train diffusion-lm --out RUN corpus=OUT_DIR/train.txt val_corpus=OUT_DIR/val.txt \\
        by_line=true model.max_len=160 ...
    python benchmarks/cdr_h3_infill.py score [--run RUN] [--split val|test] [--limit N] \\
        [--draws 64] [--methods qkv antiberty iglm profile] [--device auto] [--json F]

Chains: :func:`qkv.data.cdr.heavy_chain_splits` (AntiBERTa's paratope split of SAbDab for
val/test; training chains that share a sequence or a CDR-H3 with them removed); CDR-H3 (IMGT
105-117) by the motif heuristic :func:`qkv.data.cdr.cdr_h3_span`. Each held-out chain is scored
with its whole CDR-H3 (``L`` residues) hidden and the rest of the chain given.

- qkv diffusion LM (the run): rows as the run was trained (``by_line``: the chain from position
  0, then the end token), the span as ``L`` [MASK]s. Recovery after :func:`denoise` with
  ``steps = L``, confidence remasking, argmax; one-shot recovery (one forward, argmax:
  ``steps = 1``); one-shot pseudo-perplexity exp(mean CE of the true residues, span masked);
  the conditional bound: ``E_t[(1/t) Σ CE]`` over ``t ~ U(eps, 1)`` masking span positions only
  (MDLM Eq. 11 with the rest of the chain always given), ``--draws`` draws per chain, fixed
  seed: an upper bound on −log p(span | rest), reported as exp(bound per residue).
- AntiBERTy: ``[CLS] chain [SEP]``, the span masked, one forward: argmax recovery, one-shot
  pseudo-perplexity.
- IgLM: its infilling format (iglm 0.1.0, ``IgLM.infill`` / ``mask_span``):
  ``[HEAVY] [HUMAN] prefix [MASK] suffix [SEP]`` then the span, closed by ``[CLS]`` (the
  paper's [ANS]). Exact conditional NLL of the span (per residue; with the closing token too,
  as IgLM's ``log_likelihood`` averages it); greedy infilling with the length fixed to ``L``
  (only the 20 residues until ``L``, then stop) and free greedy infilling (residues or
  ``[CLS]``, at most :data:`MAX_FREE` tokens; recovery position by position over ``L``, missing
  positions wrong). Every chain is tagged ``[HUMAN]``, although SAbDab holds mouse antibodies too.
- profile: the most common training residue at each CDR-H3 position counted from its start
  (the overall most common past the longest); perplexity of the add-one position frequencies.
- chance: 1/20.

Recovery is the share of the span's residues predicted right, averaged over chains (± standard
error over chains). Perplexities pool the residues of every chain: exp(Σ nats / Σ residues).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from qkv.data.cdr import cdr_h3, cdr_h3_span, heavy_chain_splits
from qkv.data.tokenizers import AMINO_ACIDS
from qkv.errors import QkvError

# tests load this file by path, where the script's folder is not on sys.path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import mean_se  # noqa: E402  (benchmarks/common.py)

MAX_FREE = 60  # longest free IgLM infill (the longest CDR-H3 kept is 35)
BINS = ((3, 10), (11, 13), (14, 16), (17, 35))  # CDR-H3 length bins of the per-length table
IGLM_CHAIN, IGLM_SPECIES = "[HEAVY]", "[HUMAN]"


@dataclass
class Chain:
    """One held-out heavy chain and its CDR-H3 ``[start, end)``."""

    sequence: str
    start: int
    end: int

    @property
    def prefix(self) -> str:
        return self.sequence[: self.start]

    @property
    def span(self) -> str:
        return self.sequence[self.start : self.end]

    @property
    def suffix(self) -> str:
        return self.sequence[self.end :]


@dataclass
class Scores:
    """Per-chain results of one method: recovery, nats of the span and residues they cover."""

    perplexity_kind: str = ""
    recovery: list[float] = field(default_factory=list)
    nats: list[float] = field(default_factory=list)
    residues: list[int] = field(default_factory=list)
    predictions: list[str] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)

    def add(self, truth: str, predicted: str | None, nats: float | None = None, **extra: float) -> None:
        if predicted is not None:
            self.predictions.append(predicted)
            self.recovery.append(recovery(truth, predicted))
        if nats is not None:
            self.nats.append(nats)
            self.residues.append(len(truth))
        for k, v in extra.items():
            self.extra.setdefault(k, []).append(v)

    def summary(self, lengths: list[int]) -> dict:
        out: dict = {"n": max(len(self.recovery), len(self.nats))}
        if self.recovery:
            out["recovery"], out["stderr"] = mean_se(self.recovery)
            out["per_bin"] = {
                f"{lo}-{hi}": mean_se(
                    [r for r, n in zip(self.recovery, lengths, strict=True) if lo <= n <= hi]
                )[0]
                for lo, hi in BINS
            }
        if self.nats:
            out["perplexity"] = math.exp(sum(self.nats) / sum(self.residues))
            out["perplexity_kind"] = self.perplexity_kind
        for k, v in self.extra.items():
            out[k] = sum(v) / len(v)
        if "end_nats" in self.extra:  # IgLM's own log_likelihood averages the closing token in
            with_end = sum(self.nats) + sum(self.extra["end_nats"])
            out["perplexity_with_end"] = math.exp(with_end / (sum(self.residues) + len(self.nats)))
        return out


def recovery(truth: str, predicted: str) -> float:
    """Share of ``truth``'s positions that ``predicted`` matches (a shorter prediction counts
    its missing positions wrong; positions past ``truth`` are not counted)."""
    return sum(a == b for a, b in zip(truth, predicted, strict=False)) / len(truth)


def residue_ids(tok, text: str) -> list[int]:
    """Ids of residues, one per letter (raises :class:`QkvError` otherwise)."""
    ids = tok.encode(text, add_special_tokens=False)
    if len(ids) != len(text):
        raise QkvError(f"the tokenizer does not give one token per residue for {text[:20]}...")
    return ids


def letters(tok, ids: list[int]) -> str:
    """Residue letters of ``ids``, ``?`` for any other token (so it counts wrong, in place)."""
    return "".join(t if (t := tok.id_to_token(i)) in AMINO_ACIDS else "?" for i in ids)


def _token(tok, token: str) -> int:
    ids = tok.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        raise QkvError(f"{token} is not one token of this vocabulary")
    return ids[0]


# ---- qkv masked diffusion LM -------------------------------------------------------------------


def score_diffusion(run: Path, chains: list[Chain], draws: int, device, seed: int = 0) -> dict[str, Scores]:
    from qkv import runs
    from qkv.data.lm import end_token
    from qkv.files import read_json
    from qkv.inference.diffusion import denoise
    from qkv.train.diffusion import DEFAULT_EPS, mask_tokens, masked_diffusion_loss, sample_times

    model, tok = runs.load_run(run, device=device, family="diffusion-lm")
    eps = read_json(run / "train_config.json", "run settings").get("eps", DEFAULT_EPS)
    mask_id, end = model.config.mask_id, end_token(tok)
    g = torch.Generator(device=device).manual_seed(seed)
    iterative = Scores("conditional bound, exp(ELBO / residue)")
    one_shot = Scores("one-shot pseudo-perplexity")
    for c in chains:
        truth = residue_ids(tok, c.span)
        s, e = c.start, c.end
        x0 = torch.tensor(
            [residue_ids(tok, c.prefix) + truth + residue_ids(tok, c.suffix) + [end]], device=device
        )
        if x0.shape[1] > model.config.max_len:
            raise QkvError(f"a chain of {x0.shape[1] - 1} residues is longer than the run's context")
        x = x0.clone()
        x[0, s:e] = mask_id
        filled = denoise(model, x, steps=e - s, remasking="confidence", temperature=0.0)
        with torch.no_grad():
            logits = model(x).logits[0, s:e].float()  # (L, V)
            target = x0[0, s:e]
            ce = float(F.cross_entropy(logits, target, reduction="sum"))
            rows = x0.expand(draws, -1)
            in_span = torch.zeros_like(rows, dtype=torch.bool)
            in_span[:, s:e] = True
            t = sample_times(draws, eps, generator=g, device=device)
            xt, masked = mask_tokens(rows, t, mask_id, in_span, generator=g)
            bound = float(masked_diffusion_loss(model(xt).logits, rows, masked, t).mean())
        iterative.add(c.span, letters(tok, filled[0, s:e].tolist()), bound)
        one_shot.add(c.span, letters(tok, logits.argmax(-1).tolist()), ce)
    return {"qkv diffusion, L steps (confidence)": iterative, "qkv diffusion, one shot": one_shot}


# ---- AntiBERTy ---------------------------------------------------------------------------------


def score_antiberty(chains: list[Chain], device) -> dict[str, Scores]:
    from qkv.hub.pretrained import load

    model, tok = load("antiberty", device=device)
    out = Scores("one-shot pseudo-perplexity")
    for c in chains:
        ids = tok.encode(c.sequence)  # [CLS] residues [SEP]
        if len(ids) != len(c.sequence) + 2:
            raise QkvError("AntiBERTy's tokenizer did not frame the chain as [CLS] residues [SEP]")
        x = torch.tensor([ids], device=device)
        s, e = c.start + 1, c.end + 1
        x[0, s:e] = tok.mask_id
        with torch.no_grad():
            logits = model(x).logits[0, s:e].float()
        ce = float(F.cross_entropy(logits, torch.tensor(ids[s:e], device=device), reduction="sum"))
        out.add(c.span, letters(tok, logits.argmax(-1).tolist()), ce)
    return {"AntiBERTy, one shot": out}


# ---- IgLM --------------------------------------------------------------------------------------


def iglm_prompt(
    tok, prefix: str, suffix: str, chain: str = IGLM_CHAIN, species: str = IGLM_SPECIES
) -> list[int]:
    """IgLM's infilling input (iglm 0.1.0 ``IgLM.infill``: ``[chain, species] + mask_span(...)``):
    ``chain species prefix [MASK] suffix [SEP]``; the model then writes the span and ``[CLS]``
    (the paper's [ANS]). Raises :class:`QkvError` for a tag or residue the vocabulary lacks."""
    return [
        _token(tok, chain),
        _token(tok, species),
        *residue_ids(tok, prefix),
        tok.mask_id,
        *residue_ids(tok, suffix),
        tok.sep_id,
    ]


def span_nll(model, prompt: list[int], answer: list[int]) -> torch.Tensor:
    """Nats of each token of ``answer`` (the span and its closing token) after ``prompt`` under a
    causal LM. Shape: ``(len(answer),)`` float32."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt + answer], device=device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()  # (len(answer), V)
    return F.cross_entropy(logits, ids[0, len(prompt) :], reduction="none")


def greedy_infill(
    model,
    prompt: list[int],
    allowed: list[int],
    end_id: int,
    length: int | None = None,
    max_new: int = MAX_FREE,
) -> list[int]:
    """Greedy continuation of ``prompt`` over ``allowed`` tokens. With ``length``: exactly that
    many (``end_id`` forbidden until then), then stop; without: ``end_id`` allowed too, stop at
    it or after ``max_new`` tokens. Returns the new tokens, ``end_id`` left out."""
    device = next(model.parameters()).device
    choices = torch.tensor(allowed + ([] if length is not None else [end_id]), device=device)
    ids = list(prompt)
    for _ in range(length if length is not None else max_new):
        with torch.no_grad():
            logits = model(torch.tensor([ids], device=device)).logits[0, -1]
        nxt = int(choices[logits[choices].argmax()])
        if nxt == end_id:
            break
        ids.append(nxt)
    return ids[len(prompt) :]


def score_iglm(chains: list[Chain], device) -> dict[str, Scores]:
    from qkv.hub.pretrained import load

    model, tok = load("iglm", device=device)
    residues = residue_ids(tok, AMINO_ACIDS)
    fixed = Scores("exact conditional perplexity (span residues)")
    free = Scores()
    for c in chains:
        prompt = iglm_prompt(tok, c.prefix, c.suffix)
        nll = span_nll(model, prompt, residue_ids(tok, c.span) + [tok.cls_id])
        fixed.add(
            c.span,
            letters(tok, greedy_infill(model, prompt, residues, tok.cls_id, len(c.span))),
            float(nll[:-1].sum()),
            end_nats=float(nll[-1]),
        )
        made = letters(tok, greedy_infill(model, prompt, residues, tok.cls_id))
        free.add(c.span, made, generated_length=len(made), length_exact=float(len(made) == len(c.span)))
    return {"IgLM, greedy, length L": fixed, "IgLM, greedy, free length": free}


# ---- trivial baselines -------------------------------------------------------------------------


def score_profile(chains: list[Chain], train: list[str]) -> dict[str, Scores]:
    spans = [h for s in train if (h := cdr_h3(s)) is not None]
    columns = [Counter(h[i] for h in spans if len(h) > i) for i in range(max(map(len, spans)))]
    overall = Counter("".join(spans))
    profile = Scores("add-one position frequencies")
    chance = Scores("uniform over 20")
    for c in chains:
        counts = [columns[i] if i < len(columns) else overall for i in range(len(c.span))]
        predicted = "".join(col.most_common(1)[0][0] for col in counts)
        nats = -sum(
            math.log((col[a] + 1) / (sum(col.values()) + len(AMINO_ACIDS)))
            for a, col in zip(c.span, counts, strict=True)
        )
        profile.add(c.span, predicted, nats)
        chance.add(c.span, None, len(c.span) * math.log(len(AMINO_ACIDS)))
        chance.recovery.append(1 / len(AMINO_ACIDS))  # the expected recovery of a uniform guess
    return {"profile (most common residue per position)": profile, "chance": chance}


# ---- output ------------------------------------------------------------------------------------


def table(results: dict[str, dict], lengths: list[int]) -> str:
    lines = [
        "| method | recovery (± s.e.) | perplexity | kind | n chains |",
        "|---|---|---|---|---|",
    ]
    for name, r in results.items():
        rec = f"{r['recovery']:.3f} ± {r['stderr']:.3f}" if "recovery" in r else "-"
        ppl = f"{r['perplexity']:.2f}" if "perplexity" in r else "-"
        lines.append(f"| {name} | {rec} | {ppl} | {r.get('perplexity_kind', '-')} | {r['n']} |")
    counts = [sum(lo <= n <= hi for n in lengths) for lo, hi in BINS]
    head = " | ".join(f"L {lo}-{hi} (n={k})" for (lo, hi), k in zip(BINS, counts, strict=True))
    lines += ["", f"| recovery by CDR-H3 length | {head} |", "|---" * (len(BINS) + 1) + "|"]
    for name, r in results.items():
        if "per_bin" in r:
            cells = " | ".join(f"{v:.3f}" for v in r["per_bin"].values())
            lines.append(f"| {name} | {cells} |")
    lines.append("")
    lines.append(f"mean CDR-H3 length {sum(lengths) / len(lengths):.2f}")
    for name, r in results.items():
        if "perplexity_with_end" in r:
            lines.append(
                f"{name}: perplexity with the closing [CLS] (IgLM's average) {r['perplexity_with_end']:.2f}"
            )
        if "generated_length" in r:
            lines.append(
                f"{name}: mean generated length {r['generated_length']:.2f}, "
                f"exactly L for {100 * r['length_exact']:.0f}% of chains"
            )
    return "\n".join(lines)


def prepare(out_dir: Path) -> None:
    chains = heavy_chain_splits()
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("train", "val"):
        (out_dir / f"{name}.txt").write_text("\n".join(getattr(chains, name)) + "\n", encoding="utf-8")
    print(
        f"{out_dir}: {len(chains.train)} train, {len(chains.val)} val chains "
        f"({len(chains.test)} test chains held back)"
    )


def score(args: argparse.Namespace) -> dict:
    from qkv.device import resolve_device

    device = resolve_device(args.device)
    splits = heavy_chain_splits()
    held_out = getattr(splits, args.split)[: args.limit]
    chains = [Chain(s, *cdr_h3_span(s)) for s in held_out]
    methods = args.methods or (["qkv"] if args.run else []) + ["antiberty", "iglm", "profile"]
    scores: dict[str, Scores] = {}
    for method in methods:
        print(f"scoring {method} on {len(chains)} {args.split} chains ...", file=sys.stderr)
        if method == "qkv":
            if args.run is None:
                raise QkvError("--methods qkv needs --run RUN_DIR")
            scores |= score_diffusion(args.run, chains, args.draws, device)
        elif method == "antiberty":
            scores |= score_antiberty(chains, device)
        elif method == "iglm":
            scores |= score_iglm(chains, device)
        else:
            scores |= score_profile(chains, splits.train)
    lengths = [c.end - c.start for c in chains]
    results = {name: s.summary(lengths) for name, s in scores.items()}
    print(table(results, lengths))
    per_chain = [
        {"cdr_h3": c.span, **{n: s.predictions[i] for n, s in scores.items() if s.predictions}}
        for i, c in enumerate(chains)
    ]
    return {
        "split": args.split,
        "run": str(args.run),
        "draws": args.draws,
        "methods": results,
        "chains": per_chain,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="write OUT_DIR/train.txt and val.txt (one chain per line)")
    p.add_argument("out_dir", type=Path)
    s = sub.add_parser("score", help="CDR-H3 infilling of the held-out chains")
    s.add_argument("--run", type=Path, help="a qkv train diffusion-lm run directory")
    s.add_argument("--split", choices=("val", "test"), default="val")
    s.add_argument("--limit", type=int, help="only the first N chains")
    s.add_argument("--draws", type=int, default=64, help="Monte Carlo draws per chain for the bound")
    s.add_argument("--methods", nargs="+", choices=("qkv", "antiberty", "iglm", "profile"))
    s.add_argument("--device", default="auto")
    s.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            prepare(args.out_dir)
            return 0
        torch.set_grad_enabled(False)
        results = score(args)
    except QkvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
