"""CLI smoke run on a small slice of real Multi30k, and the bad-input contract: one-line error,
non-zero exit, no traceback, nothing already saved lost."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qkv.cli import main

DATA = Path(os.environ.get("QKV_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))
# Outside CI a missing data set skips these tests; in CI it must fail, not pass silently.
pytestmark = pytest.mark.skipif(
    not (DATA / "multi30k" / "train.de.gz").is_file() and not os.environ.get("CI"),
    reason=f"Multi30k not found under {DATA} (set QKV_DATA_DIR)",
)

SMOKE = [
    "train_limit=3000",
    "val_limit=40",
    "d_model=64",
    "n_heads=2",
    "d_ff=128",  # the demo recipe on a slice
    "n_encoder_layers=1",
    "n_decoder_layers=1",
    "vocab_size=1000",
    "max_tokens=2048",
    "eval_every=20",
    "warmup_steps=20",
    "beam_size=2",
    "snapshot_minutes=0",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    os.environ.setdefault("QKV_DATA_DIR", str(DATA))
    out = tmp_path_factory.mktemp("runs") / "smoke"
    code = main(["train", "translation", *SMOKE, "--max-steps", "40", "--quiet", "--out", str(out)])
    assert code == 0
    return out


def _qkv(*args, stdin: bytes = b"") -> subprocess.CompletedProcess:
    env = {**os.environ, "QKV_DATA_DIR": str(DATA)}
    return subprocess.run(
        [sys.executable, "-m", "qkv", *args], input=stdin, capture_output=True, env=env, timeout=300
    )


def test_smoke_run_writes_a_complete_run_directory(run_dir):
    """A short real run leaves config, weights, tokenizer, metrics, curve and a test score."""
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "train_config.json",
        "metrics.jsonl",
        "loss.png",
        "summary.json",
        "last.safetensors",
        "train_state.pt",
    ):
        assert (run_dir / name).is_file(), name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 40
    assert summary["test2016"]["n"] == 1000
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    assert len(val) == 2 and val[-1] < val[0], "validation loss must fall on real data"
    train_cfg = json.loads((run_dir / "train_config.json").read_text())
    assert train_cfg["train"]["max_steps"] == 40 and train_cfg["train"]["seed"] == 1
    config = json.loads((run_dir / "config.json").read_text())
    assert config.pop("format_version") == train_cfg["format_version"] == 2
    assert train_cfg["model"] == config and train_cfg["model_type"] == "transformer"


def test_demo_report_shows_examples_bleu_wall_time_run_directory_and_next_steps(run_dir, capsys):
    """What `make demo` prints at the end (from the smoke run's real summary)."""
    from qkv.recipes.translation import RECIPE

    err = RECIPE.summary(json.loads((run_dir / "summary.json").read_text()), run_dir)
    assert err.count("  DE:  ") == 3 and err.count("  REF: ") == 3 and err.count("  QKV: ") == 3
    line = next(row for row in err.splitlines() if row.startswith("test2016 BLEU "))
    assert "sacreBLEU, cased" in line and "40 steps" in line and "min in all" in line
    assert str(run_dir.resolve()) in line
    assert f"qkv explain {run_dir.resolve()} --serve" in err and "configs/multi30k_de_en.json" in err


def test_translate_args_and_stdin_keep_order_and_empty_lines(run_dir):
    """Lines on stdin give one translation each, in order; an empty line translates to empty."""
    res = _qkv(
        "translate",
        str(run_dir),
        "--beam",
        "2",
        stdin="Ein Mann fährt Fahrrad.\n\nZwei Hunde spielen im Schnee.\n".encode(),
    )
    assert res.returncode == 0, res.stderr.decode()
    lines = res.stdout.decode().split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
    assert lines[0].strip() and lines[2].strip()


def test_evaluate_prints_one_json_object(run_dir):
    """``qkv evaluate`` prints one JSON object with the promised keys."""
    res = _qkv("evaluate", str(run_dir), "--split", "val", "--limit", "20", "--beam", "1")
    assert res.returncode == 0, res.stderr.decode()
    result = json.loads(res.stdout)
    for key in ("bleu", "bleu_lowercase", "chrf", "loss", "ppl", "n"):
        assert key in result
    assert result["n"] == 20 and result["ppl"] > 1


def test_evaluate_and_translate_decode_as_the_run_was_tested(tmp_path):
    """Without --beam/--alpha, ``qkv evaluate`` and ``translate`` use the beam and length
    penalty of the run's own settings (its test's decoding); given ones win; a folder without
    settings gets §6.1's 4 and 0.6."""
    from qkv.recipes.translation import run_decoding

    (tmp_path / "train_config.json").write_text(json.dumps({"beam_size": 5, "alpha": 1.2}))
    assert run_decoding(tmp_path) == (5, 1.2)
    assert run_decoding(tmp_path, beam_size=1, alpha=0.0) == (1, 0.0)
    assert run_decoding(tmp_path / "elsewhere") == (4, 0.6)


def test_overlong_line_is_truncated_with_a_warning(run_dir):
    """A 10,000-word line is truncated to the model's limit, with a warning naming it."""
    res = _qkv("translate", str(run_dir), "--beam", "1", stdin=("Hund " * 10000).encode())
    assert res.returncode == 0, res.stderr.decode()
    assert "truncated to the limit of" in res.stderr.decode()
    assert len(res.stdout.decode().splitlines()) == 1


def _assert_clean_error(res: subprocess.CompletedProcess, *needles: str) -> None:
    err = res.stderr.decode()
    assert res.returncode != 0
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


def test_non_utf8_input_is_a_clean_error(run_dir):
    """Non-UTF-8 bytes on stdin: one-line error naming the problem."""
    _assert_clean_error(_qkv("translate", str(run_dir), stdin=b"Ein \xff\xfe Mann\n"), "UTF-8")


def test_missing_and_half_written_run_directories(run_dir, tmp_path):
    """A missing run dir, and one without weights, are named in a one-line error."""
    _assert_clean_error(_qkv("translate", str(tmp_path / "nope"), "Hallo"), "not found")
    half = tmp_path / "half"
    half.mkdir()
    shutil.copy(run_dir / "config.json", half / "config.json")
    _assert_clean_error(_qkv("translate", str(half), "Hallo"), "model.safetensors")


def test_corrupt_weights_are_a_clean_error(run_dir, tmp_path):
    """A truncated model.safetensors is reported as corrupt, without a traceback."""
    bad = tmp_path / "bad"
    shutil.copytree(run_dir, bad)
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    _assert_clean_error(_qkv("translate", str(bad), "Hallo"), "model.safetensors")


def test_unknown_config_key_is_a_clean_error(tmp_path):
    """An unknown key=value override is refused, naming the key, before anything is written."""
    out = tmp_path / "run"
    _assert_clean_error(_qkv("train", "translation", "d_modle=64", "--out", str(out)), "d_modle")
    assert not out.exists()


def test_existing_run_is_not_overwritten(run_dir):
    """Training into a non-empty run directory without --resume refuses and keeps the files."""
    before = (run_dir / "model.safetensors").read_bytes()
    _assert_clean_error(_qkv("train", "translation", "--out", str(run_dir)), "--resume")
    assert (run_dir / "model.safetensors").read_bytes() == before


def test_train_ends_with_the_summary_and_the_run_directory_and_json_on_request(tmp_path, capsys):
    """``qkv train`` ends with the human summary (stderr) and the run directory (stdout, alone,
    so ``RUN=$(qkv train ...)`` works); ``--json`` puts the summary.json object alone on stdout."""
    tiny = ["--task", "digits", "--quiet", "model.n_heads=2", "model.n_layers=1", "model.patch_size=4"]
    tiny += ["model.d_model=16", "model.d_ff=32", "train.max_steps=3", "train.eval_every=1000"]
    tiny += ["train.warmup_steps=1", "baseline=false", "train.threads=1", "train.precision=fp32"]
    plain, piped = tmp_path / "plain", tmp_path / "piped"
    assert main(["train", "vit", "--out", str(plain), *tiny]) == 0
    out, err = capsys.readouterr()
    assert out == f"{plain.resolve()}\n"
    assert '"steps":' not in err and "test accuracy" in err.lower()
    assert main(["train", "vit", "--out", str(piped), "--json", *tiny]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == json.loads((piped / "summary.json").read_text())
    assert json.loads(out)["steps"] == 3 and "test accuracy" in err.lower()


def test_version_prints_the_installed_distributions_version(capsys, monkeypatch):
    """``qkv --version``: the installed metadata's version (pip's; the build reads it from
    ``qkv.__version__``, which .ci/package checks in the wheel); a source tree that was never
    installed falls back to ``qkv.__version__``."""
    import importlib.metadata

    import qkv
    import qkv.cli

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"qkv {importlib.metadata.version('qkv')}\n"

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(qkv, "__version__", "9.8.7")
    monkeypatch.setattr(qkv.cli.metadata, "version", not_installed)
    assert qkv.cli.version() == "9.8.7"
