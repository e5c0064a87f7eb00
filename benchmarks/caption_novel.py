"""What a scenes captioner gets wrong, on the test scenes of seen and of held-out compositions.

    QKV_DATA_DIR=../shared/data .venv/bin/python benchmarks/caption_novel.py RUN_DIR

Prints, for a ``qkv train caption`` run (scenes, greedy decoding):

- recognition: the share of the scene's garments the caption names (as a multiset, wherever it
  puts them) and the accuracy on one-garment scenes, the figure closest to a classifier's;
- on ``test_novel``: how often the caption states the scene's held-out pair, how many failures
  have the right layout, and for each garment word that names a garment not in its slot (a
  substitution) whether its cross-attention map (last decoder layer, heads averaged) peaks on
  the garment of that slot: did the model look at the right garment and write another word?
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import numpy as np

from qkv.data.scenes import (
    HELD_OUT,
    Garment,
    Meaning,
    compositions,
    garment_words,
    load_scene_task,
    parse_caption,
)
from qkv.evaluate.captioning import pointing_hit
from qkv.inference.caption import Captioner


def stated_pairs(meaning: Meaning | None) -> set[tuple[int, str, int]]:
    """The (a, relation, b) compositions a caption's meaning states."""
    out: set[tuple[int, str, int]] = set()
    for row in meaning or ():
        if len(row) == 2:
            out.add((row[0], "left", row[1]))
    if meaning is not None and len(meaning) == 2:
        out |= {(a, "above", b) for a in meaning[0] for b in meaning[1]}
    return out


def slot_garments(garments: tuple[Garment, ...]) -> dict[tuple[int, int], Garment]:
    """The scene's garments by meaning slot: (row among the non-empty rows, position in it)."""
    rows = sorted({g.row for g in garments})
    out = {}
    for g in garments:
        row = sorted((x for x in garments if x.row == g.row), key=lambda x: x.col)
        out[(rows.index(g.row), row.index(g))] = g
    return out


def word_slots(meaning: Meaning) -> list[tuple[tuple[int, int], ...]]:
    """The slots each garment word of a canonical caption names, in order ("two Xs": two)."""
    out = []
    for r, row in enumerate(meaning):
        if len(row) == 2 and row[0] == row[1]:
            out.append(((r, 0), (r, 1)))
        else:
            out.extend(((r, j),) for j in range(len(row)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run")
    run = Path(parser.parse_args().run)
    saved = json.loads((run / "train_config.json").read_text())
    task = load_scene_task(
        saved["train_scenes"], saved["eval_scenes"], saved["split_seed"], saved["val_fraction"]
    )
    captioner, nouns = Captioner.from_run(run), garment_words()
    cfg = captioner.config
    for split in ("test", "test_novel"):
        data = task[split]
        ids = captioner.caption_ids(data.images)
        said = [parse_caption(text) for text in captioner.tokenizer.decode_batch(ids)]
        named = total = 0
        single = []
        for p, m in zip(said, data.meanings, strict=True):
            truth, guess = Counter(x for r in m for x in r), Counter(x for r in (p or ()) for x in r)
            named, total = named + sum((truth & guess).values()), total + sum(truth.values())
            if sum(truth.values()) == 1:
                single.append(truth == guess)
        line = f"{split}: garments named (anywhere) {named / total:.4f}"
        print(line + (f"; one-garment scenes {np.mean(single):.4f} (n={len(single)})" if single else ""))
        if split != "test_novel":
            continue
        exact = [p == m for p, m in zip(said, data.meanings, strict=True)]
        held = [
            bool(compositions(g) & HELD_OUT & stated_pairs(p))
            for g, p in zip(data.garments, said, strict=True)
        ]
        failures = [i for i, ok in enumerate(exact) if not ok]
        layout = [
            said[i] is not None and [len(r) for r in said[i]] == [len(r) for r in data.meanings[i]]
            for i in failures
        ]
        print(f"  exact {np.mean(exact):.4f}; held-out pair stated {np.mean(held):.4f}")
        print(f"  failures {len(failures)}, with the right layout {np.mean(layout):.4f}")
        hits = []
        for i in failures:
            p = said[i]
            if p is None or [len(r) for r in p] != [len(r) for r in data.meanings[i]]:
                continue
            words, maps = captioner.word_maps(data.images[i], ids[i])
            garment = [(w, m) for w, m in zip(words, maps, strict=True) if w.text in nouns]
            slots, by_slot = word_slots(p), slot_garments(data.garments[i])
            if len(slots) != len(garment):  # not the canonical phrasing: no slot per word
                continue
            for (w, m), slot in zip(garment, slots, strict=True):
                truth = [by_slot[s] for s in slot]
                if all(g.label != nouns[w.text] for g in truth):  # a substituted garment word
                    peak = m[-1].mean(0).reshape(-1)
                    hits.append(pointing_hit(peak, [g.box for g in truth], cfg.grid_size, cfg.image_size))
        print(f"  substituted garment words {len(hits)}: map peaks on the slot's garment {np.mean(hits):.4f}")


if __name__ == "__main__":
    main()
