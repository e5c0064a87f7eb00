"""onnxruntime (CPU) against qkv's own PyTorch inference, side by side in one run: greedy decoding
of a translation run (the first N test2016 sentences) or an LM run (N tokens from a prompt), in
generated tokens per second at batch 1 and 32, fp32, fp32 with float16-stored weights
(qkv.hub.onnx_export.store_half) and int8 (PyTorch: qkv.inference.quantize's
int8 weights with bfloat16 activations, on CPUs with native bfloat16 only; onnxruntime: its
dynamic quantizer, int8 weights of every MatMul, activations quantised per call). Before timing,
the outputs of each ONNX graph are compared with PyTorch's: how many greedy outputs are
identical (and BLEU for a translator, against the references).

    QKV_DATA_DIR=../shared/data .venv/bin/python benchmarks/onnx_speed.py RUN [--n 100] [--threads 2]

Needs `pip install 'qkv[onnx]'`. Each row runs alone, one after another, same threads.
"""

from __future__ import annotations

import argparse
import copy
import shutil
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from onnxruntime.quantization import QuantType, quantize_dynamic

import qkv
from qkv.data.batching import pad_sequences
from qkv.device import cpu_has_native_bf16
from qkv.hub.onnx_export import empty_cache, export_onnx, store_half
from qkv.inference.lm import generate_tokens
from qkv.inference.quantize import cast_weights
from qkv.inference.search import greedy_decode, strip_special
from qkv.runs.info import RunInfo

PROMPT = "ROMEO:\n"


def session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_translate(encoder, decoder, cfg, src: np.ndarray, extra_len: int = 50) -> list[list[int]]:
    """Greedy decoding through the exported graphs, as qkv's greedy_decode does (same limit)."""
    (memory,) = encoder.run(None, {"src": src})
    b = src.shape[0]
    limit = min(int((src != cfg.pad_id).sum(1).max()) + extra_len, cfg.max_len)
    cache = empty_cache(cfg, b)
    token = np.full((b, 1), cfg.bos_id, np.int64)
    out, done = np.full((b, limit), cfg.pad_id, np.int64), np.zeros(b, bool)
    for t in range(limit):
        logits, cache["past_keys"], cache["past_values"] = decoder.run(
            None, {"tgt": token, "memory": memory, "src": src, **cache}
        )
        token = logits[:, -1].argmax(-1)[:, None]
        out[:, t] = np.where(done, cfg.pad_id, token[:, 0])
        done |= token[:, 0] == cfg.eos_id
        if done.all():
            break
    return [strip_special(row, cfg.eos_id, cfg.pad_id) for row in out.tolist()]


def onnx_generate(decoder, cfg, prompt: np.ndarray, n: int) -> np.ndarray:
    cache = empty_cache(cfg, prompt.shape[0])
    tokens, out = prompt, []
    for _ in range(n):
        logits, cache["past_keys"], cache["past_values"] = decoder.run(None, {"tokens": tokens, **cache})
        tokens = logits[:, -1].argmax(-1)[:, None]
        out.append(tokens)
    return np.concatenate(out, 1)


@torch.no_grad()
def torch_generate(model, prompt: torch.Tensor, n: int) -> np.ndarray:
    """qkv's own decoding loop (qkv.inference.lm.generate_tokens, greedy)."""
    return np.array(generate_tokens(model, prompt.tolist(), n, do_sample=False))


def batches(rows: list[list[int]], size: int, pad: int) -> list[np.ndarray]:
    return [pad_sequences(rows[i : i + size], pad).numpy() for i in range(0, len(rows), size)]


def timed(fn) -> tuple[Any, float]:
    """``fn()``'s result and the seconds of its second call (the first warms the engine up)."""
    fn()
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0


def torch_models(model) -> dict:
    """qkv's PyTorch engines: fp32, and int8 weights (qkv.inference.quantize: bfloat16
    activations, so only where the CPU computes bfloat16 natively; elsewhere it is emulated and
    the row would time the emulation)."""
    models = {"torch fp32": model}
    if cpu_has_native_bf16():
        models["torch int8"] = cast_weights(copy.deepcopy(model), "int8")
    else:
        print("torch int8: skipped (no native bfloat16 on this CPU: qkv's int8 kernel would be emulated)")
    return models


def translation(run: str, folder: Path, n: int, threads: int) -> None:
    import sacrebleu

    from qkv.data.translation import load_multi30k

    model, bpe = qkv.load(run)
    cfg = model.config
    src_text, refs = load_multi30k("test2016", "de", "en")
    src_text, refs = src_text[:n], refs[:n]
    rows = [bpe.encode(s) + [cfg.eos_id] for s in src_text]
    models = torch_models(model)
    graphs = {
        "onnx fp32": (folder / "encoder.onnx", folder / "decoder.onnx"),
        "onnx fp16 weights": (folder / "encoder.fp16.onnx", folder / "decoder.fp16.onnx"),
        "onnx int8": (folder / "encoder.int8.onnx", folder / "decoder.int8.onnx"),
    }
    reference = None
    print(f"| engine | batch | tokens/s | outputs identical to torch fp32 | BLEU (first {n} test2016) |")
    print("|---|---|---|---|---|")
    for batch in (1, 32):
        inputs = batches(rows, batch, cfg.pad_id)
        for name in [*models, *graphs]:
            if name in models:
                decode = partial(greedy_decode, models[name])
                outputs, seconds = timed(lambda: [o for x in inputs for o in decode(torch.from_numpy(x))])  # noqa: B023
            else:
                enc, dec = (session(p, threads) for p in graphs[name])
                decode = partial(onnx_translate, enc, dec, cfg)
                outputs, seconds = timed(lambda: [o for x in inputs for o in decode(x)])  # noqa: B023
            reference = outputs if reference is None else reference
            same = sum(a == b for a, b in zip(outputs, reference, strict=True))
            bleu = sacrebleu.corpus_bleu(bpe.decode_batch(outputs), [refs]).score
            tokens = sum(len(o) + 1 for o in outputs)  # + eos
            print(f"| {name} | {batch} | {tokens / seconds:,.0f} | {same}/{n} | {bleu:.2f} |")


def lm(run: str, folder: Path, n: int, threads: int) -> None:
    model, tok = qkv.load(run)
    cfg = model.config
    n = min(n, cfg.max_len - len(tok.encode(PROMPT)))
    models = torch_models(model)
    graphs = {
        "onnx fp32": folder / "decoder.onnx",
        "onnx fp16 weights": folder / "decoder.fp16.onnx",
        "onnx int8": folder / "decoder.int8.onnx",
    }
    print(f"| engine | batch | tokens/s | {n} greedy tokens identical to torch fp32 |")
    print("|---|---|---|---|")
    for batch in (1, 32):
        prompt = np.array([tok.encode(PROMPT)] * batch, np.int64)
        reference = None
        for name in [*models, *graphs]:
            if name in models:
                out, seconds = timed(partial(torch_generate, models[name], torch.from_numpy(prompt), n))
            else:
                out, seconds = timed(partial(onnx_generate, session(graphs[name], threads), cfg, prompt, n))
            out = np.asarray(out)
            reference = out if reference is None else reference
            same = (out == reference).all(1).sum()
            print(f"| {name} | {batch} | {batch * n / seconds:,.0f} | {same}/{batch} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run")
    parser.add_argument("--n", type=int, default=100, help="test sentences (translation) or tokens (lm)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "onnx"
        done = export_onnx(args.run, folder)
        for graph in done.files:
            quantize_dynamic(
                folder / graph, folder / graph.replace(".onnx", ".int8.onnx"), weight_type=QuantType.QInt8
            )
            half = folder / graph.replace(".onnx", ".fp16.onnx")
            shutil.copyfile(folder / graph, half)
            store_half(half)
        sizes = {p.name: p.stat().st_size / 1e6 for p in sorted(folder.glob("*.onnx"))}
        print("files (MB): " + ", ".join(f"{k} {v:.1f}" for k, v in sizes.items()))
        recipe = RunInfo.read(Path(args.run)).recipe
        (translation if recipe == "translation" else lm)(args.run, folder, args.n, args.threads)


if __name__ == "__main__":
    main()
