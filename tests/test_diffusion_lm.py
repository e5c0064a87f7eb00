"""The masked diffusion LM (LLaDA, Nie et al. 2025; MDLM, Sahoo et al. 2024): the objective
against its definition, the bound against an exact likelihood, the sampler's invariants, the
recipe's run directory and the command line's refusals."""

from __future__ import annotations

import itertools
import json
import math
import os

import pytest
import torch
from cli_runs import DATA, TINY_LM, refused, run_main

from qkv.cli import main
from qkv.errors import ConfigError, QkvError
from qkv.inference.diffusion import DiffusionGenerator, Trace, denoise, unmask_counts
from qkv.models.config import DiffusionLMConfig
from qkv.models.diffusion_lm import DiffusionLM
from qkv.train.diffusion import estimate_bound, mask_tokens, masked_diffusion_loss, sample_times

needs_data = pytest.mark.skipif(not (DATA / "tinyshakespeare").exists(), reason="shared data not found")


def tiny(vocab: int = 6, max_len: int = 16, seed: int = 0, **kw) -> DiffusionLM:
    torch.manual_seed(seed)
    config = DiffusionLMConfig(
        vocab_size=vocab + 1, mask_id=vocab, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=max_len, **kw
    )
    return DiffusionLM(config).eval()


# ------------------------------------------------------------------ the objective


def test_loss_equals_its_definition_on_a_hand_example():
    # p = (1/2, 1/4, 1/4) at every position; row 0 masks positions 0 and 2 at t = 1/2,
    # row 1 masks position 2 at t = 1/4: (1/t) * sum of -log p(x0) over masked positions.
    logits = torch.log(torch.tensor([0.5, 0.25, 0.25])).expand(2, 3, 3)
    x0 = torch.tensor([[0, 1, 2], [2, 2, 0]])
    masked = torch.tensor([[True, False, True], [False, False, True]])
    t = torch.tensor([0.5, 0.25])
    expected = [(math.log(2) + math.log(4)) / 0.5, math.log(2) / 0.25]
    assert masked_diffusion_loss(logits, x0, masked, t).tolist() == pytest.approx(expected, abs=1e-6)


def test_forward_process_masks_at_rate_t_and_never_touches_padding():
    x0 = torch.randint(0, 5, (4, 4000))
    valid = torch.ones_like(x0, dtype=torch.bool)
    valid[:, 3000:] = False
    t = torch.tensor([0.1, 0.5, 0.9, 1.0])
    xt, masked = mask_tokens(x0, t, mask_id=5, valid=valid, generator=torch.Generator().manual_seed(0))
    rates = masked[:, :3000].float().mean(1)
    assert rates.tolist() == pytest.approx(t.tolist(), abs=0.03)
    assert not masked[:, 3000:].any()
    assert torch.equal(xt[~masked], x0[~masked]) and (xt[masked] == 5).all()


def test_stratified_times_cover_the_interval():
    t = sample_times(8, 1e-3, stratified=True, generator=torch.Generator().manual_seed(1))
    assert ((t >= 1e-3) & (t < 1)).all()
    # one draw in each eighth of [0, 1): the low-discrepancy sampler of MDLM §4.1
    assert sorted(((t - 1e-3) / (1 - 1e-3) * 8).floor().long().tolist()) == list(range(8))


def test_model_never_predicts_mask_and_attends_both_ways():
    model = tiny()
    x = torch.tensor([[0, 1, 2, 3, 4, 5]])
    logits = model(x).logits
    assert torch.isinf(logits[..., 6]).all() and torch.isfinite(logits[..., :6]).all()
    changed = model(torch.tensor([[0, 1, 2, 3, 4, 0]])).logits
    # a later token changes the first position's prediction: no look-ahead mask
    assert not torch.allclose(logits[0, 0], changed[0, 0])


def test_padding_is_never_attended():
    model = tiny()
    x = torch.tensor([[1, 2, 3, 0, 0], [1, 2, 3, 4, 5]])
    valid = torch.tensor([[True, True, True, False, False], [True] * 5])
    padded = model(x, valid).logits[0, :3]
    alone = model(x[:1, :3]).logits[0]
    assert torch.allclose(padded, alone, atol=1e-5)


def _exact(model: DiffusionLM, x: tuple[int, int]) -> tuple[float, float, float]:
    """For a length-2 sequence: the exact negative ELBO (the integral over t done by hand:
    one token masked weighs ∫(1 − t)dt = 1/2, both ∫t dt = 1/2), the any-order expectation
    E_σ[−log p(x | σ)], and −log of the model's distribution p(x) = E_σ[p(x | σ)] (the order
    in which the continuous-time reverse process unmasks the two tokens is uniform)."""
    m = model.config.mask_id

    def logp(tokens: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([tokens])).logits[0], -1)

    both, first_given, second_given = logp([m, m]), logp([x[0], m]), logp([m, x[1]])
    ce = lambda lp, i: -float(lp[i, x[i]])  # noqa: E731
    nelbo = 0.5 * (ce(second_given, 0) + ce(first_given, 1)) + 0.5 * (ce(both, 0) + ce(both, 1))
    order_01 = ce(both, 0) + ce(first_given, 1)
    order_10 = ce(both, 1) + ce(second_given, 0)
    any_order = 0.5 * (order_01 + order_10)
    nll = -math.log(0.5 * math.exp(-order_01) + 0.5 * math.exp(-order_10))
    return nelbo, any_order, nll


def test_bound_is_above_the_exact_nll_by_enumeration():
    model = tiny(vocab=3, max_len=2, seed=3)
    total = 0.0
    for x in itertools.product(range(3), repeat=2):
        nelbo, any_order, nll = _exact(model, x)
        assert nelbo == pytest.approx(any_order, abs=1e-6)  # MDLM = any-order AR in expectation
        assert nelbo >= nll - 1e-9
        total += math.exp(-nll)
    assert total == pytest.approx(1.0, abs=1e-5)  # p(x) is a distribution over the 9 sequences
    # the Monte Carlo estimator converges on the exact bound, within its standard error
    x = (2, 1)
    est = estimate_bound(
        model, [(torch.tensor([list(x)]), None)], model.config.mask_id, samples=20000, seed=0
    )
    exact = _exact(model, x)[0] / 2  # per token
    assert abs(est.nats_per_token - exact) < 4 * est.stderr + 2e-3, (est, exact)
    assert 0 < est.stderr < 0.05


def test_estimate_is_reproducible_and_counts_real_tokens():
    model = tiny()
    rows = torch.randint(0, 6, (3, 10))
    valid = torch.ones(3, 10, dtype=torch.bool)
    valid[0, 7:] = False
    a = estimate_bound(model, [(rows, valid)], 6, samples=3, seed=5)
    b = estimate_bound(model, [(rows, valid)], 6, samples=3, seed=5)
    assert a == b and a.tokens == 27 and a.stderr > 0
    assert math.isnan(estimate_bound(model, [(rows, None)], 6, samples=1).stderr)


# ------------------------------------------------------------------ the sampler


def test_unmask_counts_spread_evenly():
    assert unmask_counts(10, 4) == [3, 3, 2, 2]
    assert unmask_counts(3, 5) == [1, 1, 1, 0, 0]
    assert sum(unmask_counts(17, 17)) == 17


@pytest.mark.parametrize("remasking", ["confidence", "random"])
@pytest.mark.parametrize("block_length", [None, 3])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_given_tokens_never_change_and_no_mask_is_left(remasking, block_length, temperature):
    model = tiny()
    m = model.config.mask_id
    x = torch.tensor([[0, m, m, 3, m, m, m, 5, m, 2]] * 3)
    trace = Trace()
    out = denoise(model, x, 4, remasking, block_length, temperature, torch.Generator().manual_seed(0), trace)
    given = x != m
    assert torch.equal(out[given], x[given]) and not (out == m).any()
    # every state keeps what an earlier state fixed: unmasked tokens never change
    for before, after in itertools.pairwise(trace.states):
        kept = before != m
        assert torch.equal(after[kept], before[kept])
    assert trace.fixed_at is not None and (trace.fixed_at[given] == -1).all()
    assert (trace.fixed_at[~given] >= 0).all() and len(trace.states) == 5


def test_one_step_is_the_argmax():
    model = tiny(seed=2)
    m = model.config.mask_id
    x = torch.tensor([[1, m, m, m, 4, m]])
    expected = model(x).logits.argmax(-1)
    out = denoise(model, x, 1)
    masked = x == m
    assert torch.equal(out[masked], expected[masked])


def test_confidence_keeps_the_most_probable_first():
    model = tiny(seed=4)
    m = model.config.mask_id
    x = torch.tensor([[1, m, m, 4, m, 2, m, m]])
    trace = Trace()
    denoise(model, x, 5, trace=trace)
    with torch.no_grad():
        probs = torch.softmax(model(x).logits, -1).max(-1).values[0]
    masked = (x[0] == m).nonzero().flatten()
    assert trace.fixed_at is not None and trace.confidence is not None
    first = masked[probs[masked].argmax()]
    assert int(trace.fixed_at[0, first]) == 0
    assert float(trace.confidence[0, first]) == pytest.approx(float(probs[first]), abs=1e-6)


def test_blocks_unmask_left_to_right():
    model = tiny()
    m = model.config.mask_id
    trace = Trace()
    denoise(
        model, torch.tensor([[m] * 6]), 6, "random", block_length=2, trace=trace, generator=torch.Generator()
    )
    assert trace.fixed_at is not None
    steps = trace.fixed_at[0].tolist()
    assert max(steps[:2]) < min(steps[2:4]) and max(steps[2:4]) < min(steps[4:])


def test_seeds_reproduce_samples():
    model = tiny()
    m = model.config.mask_id
    x = torch.tensor([[m] * 10] * 2)

    def run(seed: int) -> torch.Tensor:
        return denoise(model, x, 5, "random", temperature=1.0, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(run(7), run(7)) and not torch.equal(run(7), run(8))


def test_sampler_refusals():
    model = tiny()
    m = model.config.mask_id
    with pytest.raises(QkvError, match="steps must be >= 1"):
        denoise(model, torch.tensor([[m, 1]]), 0)
    with pytest.raises(QkvError, match="number of blocks"):
        denoise(model, torch.tensor([[m] * 6]), 2, block_length=2)
    with pytest.raises(QkvError, match="same number of masks"):
        denoise(model, torch.tensor([[m, 1], [m, m]]), 2)
    with pytest.raises(QkvError, match="unknown remasking"):
        denoise(model, torch.tensor([[m, 1]]), 1, "lowest")  # type: ignore[arg-type]


# ------------------------------------------------------------------ the recipe and the CLI

TINY = [
    *TINY_LM,  # later keys win
    "eval_batches=2",
    "num_samples=2",
    "sample_tokens=40",
    "bound_samples=2",
    "train.eval_every=10",
    "train.device=cpu",  # samples and bounds are compared with the CPU's random streams
    "--quiet",
]


@pytest.fixture(scope="module")
def diffusion_run(tmp_path_factory):
    os.environ.setdefault("QKV_DATA_DIR", str(DATA))
    out = tmp_path_factory.mktemp("dlm") / "run"
    assert main(["train", "diffusion-lm", "--out", str(out), "--max-steps", "20", *TINY]) == 0
    return out


@needs_data
def test_run_reloads_to_identical_samples(diffusion_run):
    summary = json.loads((diffusion_run / "summary.json").read_text())
    v = summary["validation"]
    assert summary["steps"] == 20 and v["bound_samples"] == 2 and v["val_loss_stderr"] > 0
    assert v["val_bits_per_char"] == pytest.approx(v["val_loss"] / math.log(2))  # character vocabulary
    gen = DiffusionGenerator.from_run(diffusion_run)
    # samples.txt was written by the trained model in memory, with the run's seed and settings
    again = gen.generate("", 40, num_samples=2, seed=1337, remasking="confidence", temperature=0.8)
    assert again == summary["samples"]
    config = json.loads((diffusion_run / "config.json").read_text())
    assert config["mask_id"] == config["vocab_size"] - 1


@needs_data
def test_generate_and_infill_from_the_command_line(diffusion_run, capsys, tmp_path):
    code, out, _ = run_main(
        capsys, "generate", str(diffusion_run), "--infill", "ROMEO: ____ my lord", "--seed", "0"
    )
    assert code == 0 and out.startswith("ROMEO: ") and out.rstrip("\n").endswith(" my lord")
    assert len(out.rstrip("\n")) == len("ROMEO: ____ my lord")
    png = tmp_path / "t.png"
    code, out, _ = run_main(
        capsys, "generate", str(diffusion_run), "--prompt", "ROMEO:", "--max-new-tokens", "50",
        "--block-length", "10", "--steps", "25", "--seed", "3", "--trajectory", str(png),
    )  # fmt: skip
    assert code == 0 and out.startswith("ROMEO:") and len(out.rstrip("\n")) == 56 and png.stat().st_size > 0
    again = ("generate", str(diffusion_run), "--max-new-tokens", "20", "--seed", "9")
    code, first, _ = run_main(capsys, *again)
    assert first == run_main(capsys, *again)[1]


@needs_data
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--infill", "ROMEO: no mask here"], "has no '_'"),
        (["--infill", "_" * 40], "longer than the model's context (32)"),
        (["--infill", "a __ b", "--steps", "0"], "--steps must be >= 1"),
        (["--top-k", "5"], "apply to autoregressive LMs"),
        (["--infill", "a __ b", "--block-length", "1", "--steps", "1"], "number of blocks"),
        (["--infill", "a __ b", "--block-length", "0"], "--block-length must be >= 1"),
        (["--infill", "a __ b", "--block-length", "-1"], "--block-length must be >= 1"),
        (["--infill", "a __ b", "--mask-char", ""], "one character"),
        (["--infill", "a __ b", "--mask-char", "__"], "one character"),
        (["--infill", "a __ b", "--temperature", "-1"], "finite number > 0"),
        (["--infill", "a __ b", "--temperature", "nan"], "finite number > 0"),
        (["--infill", "a __ b", "--temperature", "inf"], "finite number > 0"),
        (["--infill", "ROMEO:_9_"], "position 7 (counted from 0)"),
    ],
)
def test_diffusion_generate_refusals(diffusion_run, capsys, args, needle):
    refused(run_main(capsys, "generate", str(diffusion_run), *args), needle)


@needs_data
def test_a_tiny_temperature_draws_the_argmax(diffusion_run, capsys):
    """1e-300 overflows float32's division; the draw is then the most likely token, as greedy."""
    greedy = run_main(capsys, "generate", str(diffusion_run), "--infill", "ROMEO: ____", "--greedy")
    tiny = run_main(
        capsys, "generate", str(diffusion_run), "--infill", "ROMEO: ____", "--temperature", "1e-300"
    )
    assert greedy[0] == tiny[0] == 0 and tiny[1] == greedy[1], tiny


@needs_data
def test_diffusion_options_refused_for_an_autoregressive_run(tmp_path, capsys):
    run = tmp_path / "ar"
    assert main(["train", "lm", "--out", str(run), "--max-steps", "2", *TINY_LM, "--quiet"]) == 0
    refused(run_main(capsys, "generate", str(run), "--infill", "a _ b"), "diffusion LM runs")
    refused(run_main(capsys, "generate", str(run), "--steps", "4"), "diffusion LM runs")


def test_settings_refusals():
    from qkv.recipes.diffusion_lm import DiffusionLMSettings

    with pytest.raises(ConfigError, match="init"):
        DiffusionLMSettings(init="iglm")
    with pytest.raises(ConfigError, match="eps"):
        DiffusionLMSettings(eps=0.0)
    with pytest.raises(ConfigError, match="remasking"):
        DiffusionLMSettings(remasking="lowest")  # type: ignore[arg-type]


@needs_data
def test_one_sequence_per_line(tmp_path):
    """Proteins, one per line: each row from position 0, padding neither attended nor scored."""
    from qkv.recipes.diffusion_lm import DiffusionLMRun, DiffusionLMSettings, evaluate_run
    from qkv.settings import resolve

    lines = ["EVQLVESGGGLVQPGGSLRLSCAAS", "QVQLQESGPGLVKPSETLSLTCTVSGGS", "DIQMTQSPSSLSASVGDRVTITC"] * 20
    corpus = tmp_path / "chains.txt"
    corpus.write_text("\n".join(lines) + "\n")
    settings = resolve(
        DiffusionLMSettings, overrides=[f"corpus={corpus}", "by_line=true", *TINY[:-1], "sample_tokens=10"]
    )
    summary = DiffusionLMRun.train(settings, tmp_path / "run", progress=False)
    # every validation row is one whole line plus its newline token
    n_val = json.loads((tmp_path / "run" / "summary.json").read_text())["validation"]["tokens"]
    assert n_val > 0 and summary["validation"]["tokens"] == n_val
    again = evaluate_run(tmp_path / "run")
    assert again["loss"] == pytest.approx(summary["validation"]["val_loss"], rel=1e-6)


@needs_data
def test_resume_continues_the_run(diffusion_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(diffusion_run, run)
    code, out, _ = run_main(
        capsys, "train", "diffusion-lm", "--out", str(run), "--resume", "--max-steps", "30", "--json", *TINY
    )
    assert code == 0 and json.loads(out)["steps"] == 30


@needs_data
def test_explainer_shows_the_trajectory_and_attention_at_a_step(diffusion_run, tmp_path):
    from qkv.explain.diffusion import MASK_LABEL, DiffusionLMExplainer
    from qkv.explain.explainer import DecodingOptions

    explainer = DiffusionLMExplainer(diffusion_run)
    template = "ROMEO: ____ my lord"
    first = explainer.explain(template, DecodingOptions(step=0, temperature=0))
    last = explainer.explain(template, DecodingOptions(temperature=0))
    out = first.output
    assert out["steps"] == 4 and out["text"] == last.output["text"] and len(out["text"]) == len(template)
    fixed = [row["step"] for row in out["trajectory"]]
    assert sorted(s for s in fixed if s >= 0) == [0, 1, 2, 3] and fixed.count(-1) == len(template) - 4
    # step 0's input still has the four masks; the last step's has one
    assert first.attention[0].query_tokens.count(MASK_LABEL) == 4
    assert last.attention[0].query_tokens.count(MASK_LABEL) == 1
    w = first.attention[0].weights
    assert w.shape[-1] == w.shape[-2] == len(template) and torch.allclose(
        w.sum(-1), torch.ones(()), atol=1e-5
    )
    with pytest.raises(QkvError, match="out of range"):
        explainer.explain(template, DecodingOptions(step=9))
    from qkv.explain.plots import write_pictures

    written = write_pictures(explainer, template, tmp_path, DecodingOptions(temperature=0))
    assert tmp_path / "trajectory.png" in written and (tmp_path / "trajectory.png").stat().st_size > 0


@needs_data
def test_a_bpe_vocabulary_trains_and_infills(tmp_path, capsys):
    """lm's BPE tokenizer: [MASK] is the id after its vocabulary, each _ of a template one piece."""
    run = tmp_path / "bpe"
    settings = [*TINY, "tokenizer=bpe", "vocab_size=300", "sample_tokens=12"]
    assert main(["train", "diffusion-lm", "--out", str(run), "--max-steps", "4", *settings]) == 0
    assert json.loads((run / "config.json").read_text())["mask_id"] == 300
    code, out, _ = run_main(capsys, "generate", str(run), "--infill", "The ___ of", "--seed", "0")
    assert code == 0 and out.startswith("The ") and out.rstrip("\n").endswith(" of")
