"""qkv's optional dependencies (:mod:`qkv.extras`): pyproject.toml declares the extras of
``EXTRAS`` with the same packages, :func:`~qkv.extras.require` refuses in one line with the pip
command, and each verb that needs an absent extra refuses before any work or file write, while
the core path (train, explain --html, generate) runs without any extra.

A core-only install is simulated in a subprocess: a ``sitecustomize.py`` on ``PYTHONPATH`` sets
``sys.modules[name] = None`` for each module named in ``QKV_BLOCK``, so ``import name`` raises
``ModuleNotFoundError`` and ``importlib.util.find_spec(name)`` is ``None``, as where the package
was never installed (``.ci/package`` checks the real thing: the wheel in a clean venv).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path

import pytest
from cli_runs import TINY_LM, digest, qkv, refused
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from qkv import extras
from qkv.errors import QkvError
from qkv.extras import DISTRIBUTIONS, EXTRAS, MissingExtra, require

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parent.parent
# pyproject.toml's extras for developers, not users: qkv[all] leaves them out
DEVELOPER = {"test", "lint", "docs", "package", "bench", "interp"}
# the core dependencies: what `import qkv`, training and decoding the text models need
CORE = {
    "torch",
    "tokenizers",
    "huggingface-hub",
    "sacrebleu",
    "safetensors",
    "tqdm",
    "numpy",
    "pillow",
    "psutil",
}
# every optional module: the extras' own, and those only they bring (scikit-learn's SciPy,
# FastAPI's Starlette and pydantic), so a core-only run cannot lean on them unnoticed
OPTIONAL = sorted({m for modules in EXTRAS.values() for m in modules} | {"scipy", "starlette", "pydantic"})


def optional_dependencies() -> dict[str, list[str]]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def distribution(module: str) -> str:
    """The pip distribution of an extra's module (the map the refusals name)."""
    return canonicalize_name(DISTRIBUTIONS.get(module, module))


def test_pyproject_declares_the_extras_of_qkv_extras():
    declared = optional_dependencies()
    user = {name: reqs for name, reqs in declared.items() if name not in DEVELOPER | {"all"}}
    assert sorted(user) == sorted(EXTRAS)
    for name, reqs in user.items():
        assert {canonicalize_name(Requirement(r).name) for r in reqs} == {
            distribution(m) for m in EXTRAS[name]
        }, name


def test_all_is_every_user_extra_and_the_tests_install_it():
    declared = optional_dependencies()
    (everything,) = [Requirement(r) for r in declared["all"]]
    assert everything.name == "qkv" and everything.extras == set(EXTRAS)
    assert "qkv[all]" in declared["test"]


def test_the_core_dependencies_hold_no_extra():
    with open(ROOT / "pyproject.toml", "rb") as f:
        core = {canonicalize_name(Requirement(r).name) for r in tomllib.load(f)["project"]["dependencies"]}
    assert core == CORE
    assert not core & {distribution(m) for modules in EXTRAS.values() for m in modules}


def test_the_distribution_map_matches_what_is_installed():
    """Where an extra's module is installed here, the distribution that provides it is the one
    the refusal names (``DISTRIBUTIONS``, else the module's own name)."""
    provided = importlib.metadata.packages_distributions()
    installed = [m for modules in EXTRAS.values() for m in modules if m in provided]
    assert len(installed) >= 5, installed  # the test extra installs every extra
    for module in installed:
        assert distribution(module) in {canonicalize_name(d) for d in provided[module]}, module


@pytest.fixture
def absent(monkeypatch):
    """``absent(*modules)``: find_spec reports those modules missing and every other one
    present, whatever this environment holds."""

    def hide(*modules: str) -> None:
        monkeypatch.setattr(
            extras.importlib.util, "find_spec", lambda name, *a: None if name in modules else object()
        )

    return hide


def test_require_names_the_missing_distribution_and_the_pip_command(absent):
    absent("fastapi")
    with pytest.raises(MissingExtra) as err:
        require("serve", "qkv explain --serve")
    assert str(err.value) == (
        "qkv explain --serve needs fastapi, which is not installed: pip install 'qkv[serve]'"
    )
    assert isinstance(err.value, QkvError)  # the CLI's one-line refusal, exit 2


def test_require_lists_every_missing_module_by_its_pip_name(absent):
    absent("Bio", "msgpack", "sklearn")
    assert extras.missing("proteins") == ["Bio", "msgpack", "sklearn"]
    with pytest.raises(
        MissingExtra, match=r"^reading FASTA files needs biopython, msgpack and scikit-learn, "
    ):
        require("proteins", "reading FASTA files")
    absent("sklearn")
    with pytest.raises(
        MissingExtra, match=r"needs scikit-learn, which is not installed: pip install 'qkv\[probe\]'$"
    ):
        require("probe", "classification metrics")


def test_require_passes_when_the_extra_is_there(absent):
    absent("fastapi")
    require("plot", "drawing pictures")  # nothing raised
    assert extras.missing("plot") == []
    with pytest.raises(KeyError):
        extras.missing("pictures")  # an extra that does not exist is a bug in the caller


def core_only(tmp_path: Path) -> dict[str, str]:
    """The environment of a subprocess in which every optional module is absent."""
    site = tmp_path / "core_only_site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import os, sys\n"
        "for name in filter(None, os.environ['QKV_BLOCK'].split(',')):\n"
        "    sys.modules[name] = None\n",
        encoding="utf-8",
    )
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "QKV_BLOCK": ",".join(OPTIONAL)}


def test_import_qkv_and_its_cli_need_no_extra(tmp_path):
    """In the simulated core install (every optional module absent, as find_spec shows),
    ``import qkv``, its command line and its models import."""
    import subprocess

    code = (
        "import importlib.util, os, qkv, qkv.cli, qkv.models; qkv.cli.build_parser(); "
        "print([m for m in os.environ['QKV_BLOCK'].split(',') if importlib.util.find_spec(m)])"
    )
    env = {**os.environ, **core_only(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]


def test_explain_serve_refuses_without_the_serve_extra(tiny_runs, tmp_path):
    run = tiny_runs["lm"]
    before = digest(run)
    done = qkv("explain", str(run), "--serve", "--port", "0", cwd=tmp_path, env=core_only(tmp_path))
    assert refused(done) == (
        "error: qkv explain --serve needs fastapi and uvicorn, which are not installed: "
        "pip install 'qkv[serve]'"
    )
    assert digest(run) == before


def test_explain_pictures_refuse_without_the_plot_extra(tiny_runs, tmp_path):
    done = qkv(
        "explain", str(tiny_runs["lm"]), "--input", "ROMEO:", "--out", str(tmp_path / "pictures"),
        cwd=tmp_path, env=core_only(tmp_path),
    )  # fmt: skip
    refused(done, "qkv explain --out (PNG pictures) needs matplotlib", "pip install 'qkv[plot]'")
    assert not (tmp_path / "pictures").exists()


def test_embed_refuses_a_fasta_without_the_proteins_extra(tiny_runs, tmp_path):
    fasta = tmp_path / "in.fasta"
    fasta.write_text(">a first\nMKTAYIAKQR\n>b\nMKVLAAGIV\n", encoding="utf-8")
    done = qkv(
        "embed", str(tiny_runs["protein"]), str(fasta), "--out", str(tmp_path / "emb"),
        cwd=tmp_path, env=core_only(tmp_path),
    )  # fmt: skip
    refused(
        done, "reading FASTA files needs biopython, msgpack and scikit-learn", "pip install 'qkv[proteins]'"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["core_only_site", "in.fasta"]


def test_the_core_path_runs_without_any_extra(tmp_path):
    """`qkv train lm`, its explainer page and `qkv generate` with every optional module absent:
    the core path imports none of them (a module-level import would fail here)."""
    env = core_only(tmp_path)
    run = tmp_path / "run"
    done = qkv(
        "train", "lm", "--out", str(run), "--quiet", "train.max_steps=3", *TINY_LM, cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (run / "summary.json").is_file()
    done = qkv(
        "explain", str(run), "--input", "ROMEO:", "--html", str(tmp_path / "page.html"), cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "page.html").stat().st_size > 10_000
    done = qkv("generate", str(run), "--prompt", "RO", "--max-new-tokens", "4", cwd=tmp_path, env=env)
    assert done.returncode == 0 and done.stdout.startswith("RO"), done.stderr[-2000:]
