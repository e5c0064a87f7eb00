"""The logit lens of a Multi30k translation run (nostalgebraist 2020; qkv.explain.logit_lens): its
decoder read teacher-forced on each reference, the share of reference pieces each decoder layer's
lens ranks top-1, and the layer where each is first ranked so.

    QKV_DATA_DIR=../shared/data .venv/bin/python benchmarks/logit_lens.py RUN [test2016|val]
"""

import sys
import time

import torch

import qkv
from qkv.data.translation import load_multi30k
from qkv.explain import logit_lens, run_with_cache

if len(sys.argv) not in (2, 3):
    sys.exit(__doc__.strip().splitlines()[-1].strip())
run = sys.argv[1]
split = sys.argv[2] if len(sys.argv) > 2 else "test2016"
model, bpe = qkv.load(run)
model.eval()
cfg = model.config
src_all, tgt_all = load_multi30k(split, "de", "en")
n = cfg.n_decoder_layers
right = torch.zeros(n)
first = torch.zeros(n + 1)
total = 0
t0 = time.perf_counter()
with torch.no_grad():
    for de, en in zip(src_all, tgt_all, strict=True):
        src = torch.tensor([bpe.encode(de) + [cfg.eos_id]])
        target = bpe.encode(en) + [cfg.eos_id]
        tgt_in = torch.tensor([[cfg.bos_id] + target[:-1]])
        _, cache = run_with_cache(model, src, tgt_in, need_weights=False)
        hits = logit_lens(model, cache).argmax(-1)[:, 0] == torch.tensor(target)
        right += hits.sum(1)
        f = torch.where(hits.any(0), hits.float().argmax(0), torch.tensor(n))
        first += torch.bincount(f, minlength=n + 1)
        total += len(target)
print(f"{split}: {len(src_all)} sentences, {total} reference pieces, {time.perf_counter() - t0:.0f} s")
for layer in range(n):
    top1, first_here = right[layer] / total, first[layer] / total
    print(f"decoder layer {layer + 1}: top-1 {top1:.1%}, first top-1 here {first_here:.1%}")
print(f"never top-1: {first[-1] / total:.1%}")
