"""The shared training loop, batching, tokenizer, data loader and checkpoint utilities."""

from __future__ import annotations

import gzip
import json
import os
import random
import unicodedata
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from qkv.data import sources, translation
from qkv.data.batching import make_batch, token_batches
from qkv.data.tokenizers import SubwordTokenizer
from qkv.errors import QkvError
from qkv.files import save_weights
from qkv.models import Transformer, TransformerConfig
from qkv.train.checkpointer import average_weights
from qkv.train.loop import train_loop
from qkv.train.losses import label_smoothed_nll
from qkv.train.optim import make_adam, noam_lr
from qkv.train.train_settings import TrainSettings

CFG = TransformerConfig(
    src_vocab_size=16,
    tgt_vocab_size=16,
    d_model=16,
    n_heads=2,
    d_ff=32,
    n_encoder_layers=1,
    n_decoder_layers=1,
    dropout=0.1,
)


def _batches(epoch: int):
    rng = random.Random(epoch)
    pairs = [
        ([rng.randrange(4, 16) for _ in range(5)], [rng.randrange(4, 16) for _ in range(6)])
        for _ in range(24)
    ]
    return [make_batch(pairs[i : i + 8], list(range(i, i + 8)), 0, 1, 2) for i in range(0, 24, 8)]


def _loss(model, batch):
    loss, _ = label_smoothed_nll(model(batch.src, batch.tgt_in).logits, batch.tgt_out, 0.1, 0)
    return loss, batch.n_tgt_tokens


def _train(run_dir, max_steps, resume=False, loss_fn=_loss, **settings):
    torch.manual_seed(0)
    model = Transformer(CFG)
    opt = make_adam(model.parameters())
    cfg = TrainSettings(max_steps=max_steps, eval_every=4, snapshot_minutes=1e9, seed=3, **settings)
    validate = lambda m: {"val_loss": 1.0}  # noqa: E731
    state = train_loop(
        model,
        opt,
        lambda s, used: noam_lr(s, 16, 4),
        _batches,
        loss_fn,
        validate,
        run_dir,
        cfg,
        progress=False,
        resume=resume,
    )
    return model, state


def test_resume_gives_the_same_weights_as_an_uninterrupted_run(tmp_path):
    """Stop after 5 steps, resume to 10: weights equal a straight 10-step run (dropout on)."""
    straight, _ = _train(tmp_path / "a", 10)
    _train(tmp_path / "b", 5)
    resumed, state = _train(tmp_path / "b", 10, resume=True)
    assert state.step == 10 and state.epoch == 3
    for (name, p), q in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(p, q), name


def _signalling(at_calls, sig, times=1):
    """A loss function that sends this process ``sig`` (``times`` times) on the given
    (1-based) calls."""
    import signal

    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        if calls["n"] in at_calls:
            for _ in range(times):
                os.kill(os.getpid(), getattr(signal, sig))
        return _loss(model, batch)

    return loss_fn


def test_ctrl_c_finishes_the_step_then_saves_an_exact_checkpoint(tmp_path):
    """Ctrl-C within step 4 lets step 4 finish, saves it and stops; resuming from there ends
    where an uninterrupted run ends, bit for bit."""
    with pytest.raises(KeyboardInterrupt):
        _train(tmp_path / "a", 10, loss_fn=_signalling({4}, "SIGINT"))
    state = torch.load(tmp_path / "a" / "train_state.pt", weights_only=True)
    assert state["loop"]["step"] == 4
    assert set(load_file(str(tmp_path / "a" / "last.safetensors")))  # a complete safetensors file
    resumed, _ = _train(tmp_path / "a", 10, resume=True)
    straight, _ = _train(tmp_path / "b", 10)
    for (name, p), q in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(p, q), name


def test_a_second_ctrl_c_stops_at_once_and_keeps_the_last_checkpoint(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        _train(tmp_path, 10, loss_fn=_signalling({6}, "SIGINT", times=2))  # both within step 6
    assert torch.load(tmp_path / "train_state.pt", weights_only=True)["loop"]["step"] == 4


def _poisoned(at_calls):
    """A loss function whose loss is NaN on the given (1-based) calls."""
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        loss, n = _loss(model, batch)
        return (loss * float("nan") if calls["n"] in at_calls else loss), n

    return loss_fn


def test_a_nan_loss_stops_the_run_naming_the_step_and_keeps_the_checkpoint(tmp_path):
    from qkv.train.loop import NonFiniteLoss

    with pytest.raises(
        NonFiniteLoss,
        match=r"non-finite loss at step 6 \(loss nan.*first non-finite "
        r"gradient: .*the last checkpoint .* is untouched",
    ):
        _train(tmp_path, 10, loss_fn=_poisoned({6}))
    state = torch.load(tmp_path / "train_state.pt", weights_only=True)
    assert state["loop"]["step"] == 4  # the checkpoint of step 4's validation, not overwritten
    assert all(torch.isfinite(t).all() for t in load_file(str(tmp_path / "last.safetensors")).values())
    assert all(torch.isfinite(t).all() for t in state["model"].values())


def test_skip_nonfinite_skips_that_many_steps_then_stops(tmp_path):
    from qkv.train.loop import NonFiniteLoss

    model, state = _train(tmp_path / "a", 6, loss_fn=_poisoned({2, 5}), skip_nonfinite=2)
    assert state.step == 6 and state.skipped_nonfinite == 2
    assert all(torch.isfinite(p).all() for p in model.parameters())
    rows = [json.loads(r) for r in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped_nonfinite"] for r in rows if "skipped_nonfinite" in r] == [1, 2]
    with pytest.raises(NonFiniteLoss, match="at step 2 "):  # the second bad batch is one too many
        _train(tmp_path / "b", 6, loss_fn=_poisoned({2, 3, 5}), skip_nonfinite=1)


def test_a_truncated_state_is_named_and_the_previous_one_offered(tmp_path):
    from qkv.train.train_state import previous_state_path

    _train(tmp_path, 9)  # checkpoints at steps 0, 4, 8, 9: the state of step 8 is kept as .prev
    path = tmp_path / "train_state.pt"
    assert torch.load(previous_state_path(path), weights_only=True)["loop"]["step"] == 8
    path.write_bytes(path.read_bytes()[:1000])  # as a crash mid-write would leave it, unrenamed
    with pytest.raises(
        QkvError,
        match=r"train_state.pt is truncated; the previous state train_state.prev.pt "
        r"\(step 8\) is readable: mv ",
    ):
        _train(tmp_path, 12, resume=True)
    os.replace(previous_state_path(path), path)  # what the message offers
    _, state = _train(tmp_path, 12, resume=True)
    assert state.step == 12


def test_resume_drops_the_metric_rows_it_will_write_again(tmp_path):
    from qkv.train.train_state import previous_state_path

    def steps(run):
        return [json.loads(r)["step"] for r in (run / "metrics.jsonl").read_text().splitlines()]

    _train(tmp_path / "a", 12)
    _train(tmp_path / "b", 10)  # rows up to step 10; states of steps 8 (.prev) and 10
    state = tmp_path / "b" / "train_state.pt"
    os.replace(previous_state_path(state), state)  # as if killed just before step 10's checkpoint
    _train(tmp_path / "b", 12, resume=True)  # redoes steps 9 and 10
    assert steps(tmp_path / "b") == steps(tmp_path / "a") == [4, 8, 12]


def test_gradient_accumulation_normalises_by_target_tokens(tmp_path):
    """Two micro-batches accumulated equal one batch holding both (same loss normaliser)."""
    batches = _batches(0)
    merged = make_batch(
        [
            (s[s != 0][:-1].tolist(), t[t != 0][:-1].tolist())
            for b in batches[:2]
            for s, t in zip(b.src, b.tgt_out, strict=True)
        ],
        list(range(16)),
        0,
        1,
        2,
    )
    results = []
    for accum, data in ((2, batches[:2]), (1, [merged])):
        torch.manual_seed(0)
        model = Transformer(CFG).eval()  # no dropout: the two must match exactly in math
        # SGD: the update is the gradient itself (Adam would magnify round-off, e.g. in the
        # key bias, whose true gradient is zero).
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        # fp32: "auto" is bf16 autocast on a CPU with native bfloat16, whose round-off differs
        # between one batch and two
        cfg = TrainSettings(
            max_steps=1,
            accum_steps=accum,
            eval_every=100,
            snapshot_minutes=1e9,
            clip_norm=None,
            precision="fp32",
        )
        model.train = lambda mode=True, model=model: model  # keep eval mode inside the loop
        train_loop(
            model,
            opt,
            lambda s, used: 0.5,
            lambda e, data=data: data,
            _loss,
            None,
            tmp_path / str(accum),
            cfg,
            progress=False,
        )
        results.append(model.state_dict())
    for k in results[0]:
        assert torch.allclose(results[0][k], results[1][k], atol=1e-6), k


def test_token_batches_respect_budget_and_cover_every_example():
    """Every example appears once; padded size stays within max_tokens (unless alone)."""
    rng = random.Random(0)
    lengths = [(rng.randint(1, 40), rng.randint(1, 40)) for _ in range(500)]
    batches = token_batches(lengths, 300, shuffle=True, seed=1)
    assert sorted(i for b in batches for i in b) == list(range(500))
    for b in batches:
        width = max(max(lengths[i]) for i in b) + 1
        assert len(b) == 1 or width * len(b) <= 300
    assert batches != token_batches(lengths, 300, shuffle=True, seed=2)


def test_make_batch_shifts_target_by_one():
    """Decoder input is bos + target; labels are target + eos; padding is pad_id."""
    b = make_batch([([5, 6], [7, 8, 9]), ([5], [7])], [0, 1], pad_id=0, bos_id=1, eos_id=2)
    assert b.src.tolist() == [[5, 6, 2], [5, 2, 0]]
    assert b.tgt_in.tolist() == [[1, 7, 8, 9], [1, 7, 0, 0]]
    assert b.tgt_out.tolist() == [[7, 8, 9, 2], [7, 2, 0, 0]]
    assert b.n_tgt_tokens == 6


def test_bpe_round_trip_restores_detokenized_text():
    """decode(encode(x)) gives back x (after NFKC), including punctuation and digits."""
    texts = ["Ein Mann fährt Fahrrad.", "Zwei Hunde, 12 Katzen!", "A man\u00a0rides a bike."] * 20
    tok = SubwordTokenizer.train(texts, vocab_size=120)
    for t in texts[:3]:
        assert tok.decode(tok.encode(t)) == unicodedata.normalize("NFKC", t)
    assert tok.unk_id in tok.encode("ß")  # an unseen character becomes <unk>
    assert tok.decode([tok.bos_id, *tok.encode("Ein Mann"), tok.eos_id, tok.pad_id]) == "Ein Mann"


def test_a_corrupt_snapshot_is_named_not_averaged(tmp_path):
    torch.manual_seed(0)
    for name in ("a", "b"):
        save_weights(Transformer(CFG), tmp_path / f"{name}.safetensors")
    snapshot = tmp_path / "b.safetensors"
    snapshot.write_bytes(snapshot.read_bytes()[:-100])  # a half-written file
    with pytest.raises(QkvError, match=r"cannot read .*b.safetensors: truncated or corrupt"):
        average_weights([tmp_path / "a.safetensors", snapshot], tmp_path / "avg.safetensors")
    assert not (tmp_path / "avg.safetensors").exists()


def test_average_weights_is_the_elementwise_mean(tmp_path):
    """Averaging two checkpoints gives their mean; tied weights survive the round trip."""
    torch.manual_seed(0)
    a, b = Transformer(CFG), Transformer(CFG)
    save_weights(a, tmp_path / "a.safetensors")
    save_weights(b, tmp_path / "b.safetensors")
    average_weights([tmp_path / "a.safetensors", tmp_path / "b.safetensors"], tmp_path / "avg.safetensors")
    avg = load_file(str(tmp_path / "avg.safetensors"))
    sa, sb = a.state_dict(), b.state_dict()
    for k, v in avg.items():
        assert torch.allclose(v, (sa[k] + sb[k]) / 2, atol=1e-7), k


def test_multi30k_missing_files_name_where_to_put_them(tmp_path, monkeypatch):
    """No local file and a failed download: the error says to use $QKV_DATA_DIR/multi30k/."""
    monkeypatch.setenv("QKV_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def offline(url, dest):
        raise OSError("network unreachable")

    monkeypatch.setattr(sources.urllib.request, "urlretrieve", offline)
    with pytest.raises(QkvError, match=r"QKV_DATA_DIR.*multi30k|multi30k.*QKV_DATA_DIR"):
        translation.load_multi30k("val")


def test_multi30k_download_is_checksum_verified(tmp_path, monkeypatch):
    """A downloaded file with the wrong sha256 is refused and not kept in the cache."""
    monkeypatch.setenv("QKV_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def fake(url, dest):
        with gzip.open(dest, "wt") as f:
            f.write("not multi30k\n")

    monkeypatch.setattr(sources.urllib.request, "urlretrieve", fake)
    with pytest.raises(QkvError, match="sha256"):
        translation.load_multi30k("val")
    assert not list((tmp_path / "cache").rglob("*.gz"))


def test_multi30k_loader_reads_real_files_and_copes_with_oddities(monkeypatch):
    """Real train split: 29,000 aligned pairs, the '@@' lines kept as data, not a crash."""
    data = Path(os.environ.get("QKV_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))
    if not (data / "multi30k" / "train.de.gz").is_file() and not os.environ.get("CI"):
        pytest.skip("Multi30k not available (set QKV_DATA_DIR)")
    monkeypatch.setenv("QKV_DATA_DIR", str(data))
    src, tgt = translation.load_multi30k("train")
    assert len(src) == len(tgt) == 29000
    assert src[16509] == "@@" and tgt[16509].strip()
    with pytest.raises(QkvError, match="unknown Multi30k split"):
        translation.load_multi30k("dev")
    json.dumps(src[:5])  # plain str lines


def test_sigterm_stops_like_ctrl_c(tmp_path):
    """SIGTERM during step 3 saves step 3 and stops, like Ctrl-C; the handlers are restored."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        _train(tmp_path, 10, loss_fn=_signalling({3}, "SIGTERM"))
    assert torch.load(tmp_path / "train_state.pt", weights_only=True)["loop"]["step"] == 3
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and signal.getsignal(signal.SIGINT) is before


def test_time_budget_schedule_decays_over_the_budget_not_the_steps():
    cfg = TrainSettings(schedule="linear", lr=1e-3, warmup_steps=9, min_lr_ratio=0.0, max_minutes=10)
    lr = cfg.lr_schedule(d_model=64)
    assert lr(1, 0.0) == pytest.approx(1e-4)  # warm-up by steps
    assert lr(10, 0.0) == pytest.approx(1e-3)  # peak at the end of warm-up
    assert lr(500, 0.5) == pytest.approx(5e-4)  # half the time spent: half way down
    assert lr(10, 1.0) == 0.0 and lr(10, 1.7) == 0.0  # the budget's end is the decay's end
    cosine = TrainSettings(schedule="cosine", lr=1e-3, warmup_steps=0, min_lr_ratio=0.1, max_minutes=3)
    assert cosine.lr_schedule(64)(7, 0.5) == pytest.approx(1e-4 + 0.5 * 9e-4)
    # A step budget keeps the step schedule (the time fraction is ignored).
    steps = TrainSettings(schedule="linear", lr=1e-3, warmup_steps=0, min_lr_ratio=0.0, max_steps=100)
    assert steps.lr_schedule(64)(51, 0.99) == pytest.approx(5e-4)
    with pytest.raises(ValueError, match="needs an end"):
        TrainSettings(schedule="linear", max_minutes=None).lr_schedule(64)


def test_a_run_started_from_python_measures_the_load_and_leaves_the_threads_alone(tmp_path, monkeypatch):
    """Without an entry point's CpuShare (``qkv train`` hands one over), a run measures the
    machine's load for its summary, but neither sleeps to look at it nor changes torch's thread
    count, however busy the machine: a program that trains through qkv keeps its own."""
    from cli_runs import TINY_LM

    from qkv import cpu_share
    from qkv.recipes.registry import get
    from qkv.settings import resolve

    class BusyMachine:  # other processes keep 1.5 of 2 CPUs busy: a managed share would take 1
        cpus = [0, 1]

        def others(self) -> tuple[float, float]:
            return 1.0, 1.5

    slept: list[float] = []
    monkeypatch.setattr(cpu_share, "LoadSampler", BusyMachine)
    monkeypatch.setattr(cpu_share, "_sleep", slept.append)
    monkeypatch.setattr(cpu_share, "INTERVAL_S", 0.0)  # a look after every step
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(200))
    )
    recipe = get("lm")
    settings = resolve(recipe.settings, overrides=[f"corpus={corpus}", *TINY_LM, "train.max_steps=4"])
    found = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        summary = recipe.train(settings, tmp_path / "run", progress=False)
        assert torch.get_num_threads() == 2 and not slept
    finally:
        torch.set_num_threads(found)
    assert summary["steps"] == 4 and summary["cpu_share"]["threads"] == [2]
    assert summary["cpu_share"]["others_cpus"] == 1.5
