"""The model card (``README.md``) of a folder ``qkv convert --to hf`` or ``--to peft`` writes,
and the upload of that folder to the Hugging Face Hub (``--push REPO``).

A card is a :class:`huggingface_hub.ModelCard`: YAML metadata (:class:`huggingface_hub.ModelCardData`)
above a Markdown body. The metadata holds only what the run's own files say:

- ``library_name`` (``transformers``; ``peft`` for an adapter), ``pipeline_tag`` (the task the
  exported architecture computes), ``tags`` (``qkv``, the recipe, the HF family, ``protein`` for
  a residue vocabulary), ``datasets`` (the named data sets of ``train_config.json``: a corpus,
  a task, the recipe's default data; a local file is not a data set id and is left out),
  ``language`` (a Multi30k translation's pair), ``base_model`` (a Hub model the run started from);
- ``model-index``: one :class:`huggingface_hub.EvalResult` per figure of ``summary.json``'s
  ``validation``/``test`` entries, with the summary's name as ``metric_name`` and its value as
  written (counts, decoding settings and baselines left out), only where the exported model
  computes what was measured (a classifier's head that the export leaves out: its figures are
  in the body, not in the metadata);
- ``qkv``: the qkv version, recipe, model type, the model's sizes and the run's steps and
  minutes.

The body says what the model is (family, sizes, parameters), how it was trained, its recorded
results, how to load it with ``transformers`` (the Auto class of its architecture) and with
qkv, its limits, and the whole ``train_config.json`` in a collapsed block (a local path shown
by its last part: a card is meant to be published).

Validated offline, before the file is written (:func:`check_card`): the text parses with
``ModelCard`` (YAML → ``ModelCardData``, whose constructor turns ``model-index`` back into
``EvalResult`` objects with ``huggingface_hub.repocard_data.model_index_to_eval_results``
and requires ``model_name`` beside them), and the parsed metadata equals the metadata written.
``ModelCard.validate`` (the Hub's server-side schema check) needs the network and is not run.

Upload (:func:`push_folder`): ``HfApi.create_repo(exist_ok=True)`` then ``upload_folder``, with
the token ``huggingface_hub`` finds (``hf auth login``, ``HF_TOKEN``); :func:`refuse_push`
checks the repository id, offline mode and the token before anything is written.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any, Protocol

from .. import __version__, runs
from ..data.tokenizers import AminoAcidTokenizer, CharTokenizer, HFTokenizer, SubwordTokenizer, load_tokenizer
from ..errors import QkvError
from ..files import write_text
from ..models.config import ModelConfig
from ..runs.layout import SUMMARY, TOKENIZER, TRAIN_CONFIG

if TYPE_CHECKING:
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

logger = logging.getLogger(__name__)

CARD = "README.md"  # the Hub shows a repository's README.md as its model card

# an architecture qkv writes → (the transformers Auto class that loads it, the Hub's pipeline tag)
ARCHITECTURES = {
    "BertForMaskedLM": ("AutoModelForMaskedLM", "fill-mask"),
    "EsmForMaskedLM": ("AutoModelForMaskedLM", "fill-mask"),
    "BertModel": ("AutoModel", "feature-extraction"),
    "EsmModel": ("AutoModel", "feature-extraction"),
    "GPT2LMHeadModel": ("AutoModelForCausalLM", "text-generation"),
    "MarianMTModel": ("AutoModelForSeq2SeqLM", "translation"),
    "ViTForImageClassification": ("AutoModelForImageClassification", "image-classification"),
    "ViTModel": ("AutoModel", "image-feature-extraction"),
}
# the task a recipe's validation and test figures measure: they enter model-index only where
# the exported architecture computes that task (a classifier's head has no HF counterpart)
RECIPE_TASKS = {
    "lm": "text-generation",
    "translation": "translation",
    "protein-mlm": "fill-mask",
    "vit": "image-classification",
}
PEFT_TASKS = {
    "CAUSAL_LM": "text-generation",
    "SEQ_CLS": "text-classification",
    "TOKEN_CLS": "token-classification",
}
SPLITS = {"validation": "validation", "test": "test", "test2016": "test2016"}  # summary key → split
# a split's entries that are not figures of the model: counts, decoding settings, baselines
NOT_METRICS = frozenset(
    {"n", "tokens", "masked_positions", "bound_samples", "beam_size", "alpha", "decode_seconds"}
    | {"uniform_ppl", "unigram_ppl"}
)
# qkv's metric names → the Hub's metric ids (https://hf.co/metrics); others keep their name in
# model-index and stay out of the `metrics` list
METRIC_IDS = {
    "accuracy": "accuracy",
    "ppl": "perplexity",
    "bleu": "sacrebleu",
    "chrf": "chrf",
    "exact": "exact_match",
    "mcc": "matthews_correlation",
    "macro_f1": "f1",
    "auroc": "roc_auc",
}
DEFAULT_DATA = {"translation": ("multi30k",), "protein-mlm": ("uniprot", "refseq")}  # data=None
SIZES = (
    *("n_layers", "n_encoder_layers", "n_decoder_layers", "d_model", "n_heads", "d_ff"),
    *("vocab_size", "src_vocab_size", "tgt_vocab_size", "max_len", "image_size", "patch_size", "num_labels"),
)


class AdapterExport(Protocol):
    """What :func:`peft_card` reads of a :class:`qkv.hub.peft_export.PeftExport`, as a
    protocol: that module imports :mod:`qkv.hub.convert`, which imports this one."""

    @property
    def out(self) -> Path: ...
    @property
    def auto_class(self) -> str: ...
    @property
    def base_weights(self) -> str: ...
    @property
    def target_modules(self) -> list[str]: ...
    @property
    def modules_to_save(self) -> list[str]: ...
    @property
    def config(self) -> ModelConfig: ...
    @property
    def parameters(self) -> int: ...
    @property
    def peft_config(self) -> dict: ...


@dataclass(frozen=True)
class RunFacts:
    """What a card says about a run directory, read once (:meth:`read`).

    Attributes:
        recipe: the recipe (``"lm"``); settings: ``train_config.json``; summary:
            ``summary.json`` (``{}`` for a converted checkpoint); sizes: the model config's
            sizes (``n_layers``, ``d_model``, ...); parameters: the model's parameter count;
            tokenizer: what ``tokenizer.json`` is (``None``: no tokenizer, a ViT).
    """

    recipe: str
    settings: dict[str, Any]
    summary: dict[str, Any]
    sizes: dict[str, int]
    parameters: int
    tokenizer: Any

    @classmethod
    def read(cls, run_dir: Path, config: ModelConfig, parameters: int) -> RunFacts:
        """Read ``run_dir``'s settings, summary and tokenizer (the model's ``config`` and
        parameter count come from the caller, which has the model loaded).

        Raises:
            QkvError: an unreadable ``train_config.json``, ``summary.json`` or tokenizer.
        """
        info = runs.RunInfo.read(run_dir)
        sizes = {k: v for k in SIZES if isinstance(v := getattr(config, k, None), int) and v > 0}
        tok = load_tokenizer(run_dir / TOKENIZER) if (run_dir / TOKENIZER).is_file() else None
        summary = runs.run_json(run_dir, SUMMARY, missing={})
        return cls(info.recipe, info.settings, summary, sizes, parameters, tok)

    @property
    def protein(self) -> bool:
        """Whether the model reads residues (qkv's amino-acid vocabulary, or ESM's/AntiBERTy's)."""
        tok = self.tokenizer
        return isinstance(tok, AminoAcidTokenizer) or (
            isinstance(tok, HFTokenizer) and tok.is_residue_vocabulary
        )

    @property
    def inputs(self) -> list[str]:
        """What the run read, as recorded: ``data`` where given (it replaces a corpus), else
        ``corpus``, ``val_corpus``, ``task`` (a name, or an absolute path)."""
        s = self.settings
        keys = ("data",) if isinstance(s.get("data"), str) else ("corpus", "val_corpus", "task")
        return [v for k in keys if isinstance(v := s.get(k), str) and v]

    @property
    def datasets(self) -> list[str]:
        """The data sets the run read, by name (a path is not a name), else the recipe's
        default data (``data`` unset)."""
        names = [v for v in self.inputs if not PurePath(v).is_absolute()]
        if not names and "data" in self.settings and self.settings["data"] is None:
            names = list(DEFAULT_DATA.get(self.recipe, ()))
        return list(dict.fromkeys(names))

    @property
    def language(self) -> list[str] | None:
        """A Multi30k translation's language pair (the recipe's own data); else ``None``."""
        s = self.settings
        if self.recipe.startswith("translation") and s.get("data", "") is None and s.get("src_lang"):
            return [s["src_lang"], s["tgt_lang"]]
        return None


def hf_card(
    run_dir: Path,
    out_dir: Path,
    architecture: str,
    family: str,
    config: ModelConfig,
    parameters: int,
    repo_id: str | None,
) -> ModelCard:
    """The card of the HF folder ``out_dir`` exported from ``run_dir`` as ``architecture`` of
    HF ``family`` (``"gpt2"``; the model's ``config`` and ``parameters`` count): the module
    docstring's metadata and body. ``repo_id``: the Hub repository it is pushed to (the
    model's name, and the loading snippets' source; without one they name
    ``path/to/<out_dir's name>``).

    Raises:
        QkvError: an unreadable run file, or a card that does not parse back (:func:`_card`).
    """
    facts = RunFacts.read(run_dir, config, parameters)
    auto_class, task = ARCHITECTURES.get(architecture, ("AutoModel", None))
    measured = task is not None and RECIPE_TASKS.get(facts.recipe) == task
    name = _model_name(out_dir, repo_id)
    where = repo_id or f"path/to/{name}"
    data = _card_data(facts, name, "transformers", task, [family], measured)
    lines = _intro(facts, f"A `{architecture}` ({family})", "`qkv convert --to hf`", name)
    lines += _results(facts, measured)
    imports, statements = _tokenizer_lines(facts, f'"{where}"')
    lines += [
        "## How to use",
        "",
        "With `transformers`:",
        "",
        "```python",
        f"from transformers import {auto_class}",
    ]
    lines += [*imports, "", f'model = {auto_class}.from_pretrained("{where}")', *statements, "```", ""]
    lines += _qkv_lines(where, name)
    head = getattr(config, "num_labels", 0) > 0 and not architecture.endswith("ForImageClassification")
    lines += _limits(facts, head_left_out=head)
    return _card(data, lines, facts)


def peft_card(run_dir: Path, done: AdapterExport, repo_id: str | None) -> ModelCard:
    """The card of a PEFT adapter folder written by :func:`qkv.hub.peft_export.export_peft`
    (``done``; ``peft_config``: its ``adapter_config.json``): ``library_name: peft``, the base
    model on the Hub where the run started from one, the adapter's rank and targets, and how
    to load base and adapter (the base is the folder's ``base/``).

    Raises:
        QkvError: as :func:`hf_card`.
    """
    peft_config = done.peft_config
    facts = RunFacts.read(run_dir, done.config, done.parameters)
    task = PEFT_TASKS.get(peft_config.get("task_type", ""))
    name = _model_name(done.out, repo_id)
    where = repo_id or f"path/to/{name}"
    data = _card_data(facts, name, "peft", task, ["lora"], measured=True)
    what = "A LoRA adapter for PEFT, its base model (sizes below) in `base/`"
    lines = _intro(facts, what, "`qkv convert --to peft`", name)
    lines += [
        f"LoRA: rank {peft_config['r']}, alpha {peft_config['lora_alpha']}, on "
        + ", ".join(f"`{m}`" for m in done.target_modules)
        + (
            f"; the trained head saved whole: {', '.join(done.modules_to_save)}"
            if done.modules_to_save
            else ""
        )
        + f". The base weights W0: {done.base_weights}.",
        "",
    ]
    lines += _results(facts, measured=True)
    fetch = [f'folder = snapshot_download("{repo_id}")'] if repo_id else [f'folder = "{where}"']
    imports, statements = _tokenizer_lines(facts, 'folder + "/base"')
    lines += ["## How to use", "", "With `transformers` and `peft`:", "", "```python"]
    lines += [
        *(["from huggingface_hub import snapshot_download"] if repo_id else []),
        "from peft import PeftModel",
    ]
    lines += [f"from transformers import {done.auto_class}", *imports, "", *fetch]
    lines += [f'base = {done.auto_class}.from_pretrained(folder + "/base")']
    lines += ["model = PeftModel.from_pretrained(base, folder)", *statements, "```", ""]
    lines += ["`adapter_config.json` names the base by the local path it was written at: load the base"]
    lines += ["as above rather than through `AutoPeftModel`.", ""]
    lines += _limits(facts, head_left_out=False)
    return _card(data, lines, facts)


def write_card(card: ModelCard, folder: Path) -> Path:
    """Write ``card`` as ``folder/README.md`` (atomically); return the path."""
    path = Path(folder) / CARD
    write_text(path, str(card))
    return path


def check_card(path: str | Path) -> ModelCard:
    """Read a card back as ``huggingface_hub`` reads one, offline: ``ModelCard.load`` (the
    YAML metadata into ``ModelCardData``, ``model-index`` into ``EvalResult`` objects by
    ``model_index_to_eval_results``), and those results written back as a ``model-index``
    (``eval_results_to_model_index``) must be the file's own: nothing in it went unread.

    Raises:
        QkvError: no file, metadata that is not a YAML mapping, a ``model-index`` that
            ``huggingface_hub`` cannot read, or one with entries it leaves out.
    """
    from huggingface_hub import ModelCard, metadata_load
    from huggingface_hub.repocard_data import eval_results_to_model_index, model_index_to_eval_results

    path = Path(path)
    if not path.is_file():
        raise QkvError(f"model card not found: {path}")
    try:
        card = ModelCard.load(path)
        index = (metadata_load(path) or {}).get("model-index")
        if index is not None and eval_results_to_model_index(*model_index_to_eval_results(index)) != index:
            raise ValueError("its model-index holds entries huggingface_hub does not read")
    except (ValueError, KeyError, TypeError) as exc:  # yaml's errors are ValueErrors
        raise QkvError(f"{path}: not a model card huggingface_hub reads: {_first_line(exc)}") from None
    return card


def refuse_push(repo_id: str) -> None:
    """What ``--push REPO`` checks before anything is written: a valid repository id, the Hub
    not in offline mode (``HF_HUB_OFFLINE``), and a token (``hf auth login`` or ``HF_TOKEN``).

    Raises:
        QkvError: the first of these that fails, in one line naming ``repo_id``.
    """
    from huggingface_hub import get_token, is_offline_mode
    from huggingface_hub.errors import HFValidationError, OIDCError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise QkvError(f"--push {repo_id}: not a Hub repository id (NAME or ORG/NAME): {exc}") from None
    if is_offline_mode():
        raise QkvError(
            f"--push {repo_id}: the Hub is in offline mode (HF_HUB_OFFLINE is set); unset it to upload, "
            f"or export without --push and run `hf upload {repo_id} DIR` later"
        )
    try:
        token = get_token()
    except OIDCError as exc:
        raise QkvError(f"--push {repo_id}: no Hub token: {_first_line(exc)}") from None
    if not token:
        raise QkvError(
            f"--push {repo_id}: not logged in to the Hugging Face Hub: run `hf auth login` (or set HF_TOKEN)"
        )


def push_folder(folder: Path, repo_id: str) -> str:
    """Upload ``folder`` to the Hub model repository ``repo_id``, creating it if needed
    (``HfApi.create_repo(exist_ok=True)``, then ``HfApi.upload_folder``: one commit); return
    the repository's URL. The folder stays as it is, whatever happens.

    Raises:
        QkvError: the Hub refused (no right to write there, ...) or could not be reached, in
            one line naming ``repo_id`` and how to upload the folder later.
    """
    import httpx
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi()
    try:
        url = api.create_repo(repo_id, exist_ok=True)
        api.upload_folder(
            repo_id=repo_id, folder_path=folder, commit_message=f"qkv {__version__}: {Path(folder).name}"
        )
    except (HfHubHTTPError, httpx.HTTPError, OSError) as exc:
        raise QkvError(
            f"could not push {folder} to {repo_id}: {_first_line(exc)}; the folder is written "
            f"(`hf upload {repo_id} {folder}` uploads it later)"
        ) from None
    logger.info(f"pushed {folder} to {url}")
    return str(url)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _model_name(out_dir: Path, repo_id: str | None) -> str:
    """The model's name: the repository's name, else the exported folder's."""
    return repo_id.rpartition("/")[2] if repo_id else Path(out_dir).resolve().name


def _hub_origin(source: Any) -> str | None:
    """The Hub model a recorded ``init`` or ``converted_from`` names: a Hub name (its revision
    dropped), an ESM-2 name (``facebook/<name>``), or, one level down, the Hub model a local
    run directory was converted from; ``None`` otherwise."""
    from .hub_names import ESM2_NAMES, is_hub_name, split_revision

    if not isinstance(source, str) or not source:
        return None
    if source in ESM2_NAMES and not Path(source).exists():
        return f"facebook/{source}"
    if is_hub_name(source):
        return split_revision(source)[0]
    origin = (
        runs.run_settings(source).get("converted_from") if (Path(source) / TRAIN_CONFIG).is_file() else None
    )
    return _hub_origin(origin) if origin != source else None


def _figures(summary: dict) -> list[tuple[str, str, float]]:
    """``(split, name, value)`` of every finite figure of the summary's validation and test
    entries (:data:`SPLITS`), counts and baselines (:data:`NOT_METRICS`) left out."""
    import math

    out = []
    for key, split in SPLITS.items():
        entry = summary.get(key)
        for name, value in (entry or {}).items() if isinstance(entry, dict) else ():
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if number and name not in NOT_METRICS and math.isfinite(value):
                out.append((split, name, value))
    return out


def _eval_results(facts: RunFacts, task: str) -> list[EvalResult]:
    """The summary's figures as ``EvalResult`` entries of ``task`` on the run's data (the
    validation split on ``val_corpus`` where the run had one)."""
    from huggingface_hub import EvalResult

    data = facts.datasets or _local_data(facts) or ["unrecorded"]
    val = facts.settings.get("val_corpus") if isinstance(facts.settings.get("val_corpus"), str) else None
    results = []
    for split, name, value in _figures(facts.summary):
        dataset = PurePath(val).name if val and split == "validation" else data[0]
        base = name.removeprefix("val_")
        results.append(
            EvalResult(
                task_type=task,
                dataset_type=dataset,
                dataset_name=dataset,
                dataset_split=split,
                metric_type=METRIC_IDS.get(base, base),
                metric_name=name,
                metric_value=value,
            )
        )
    return results


def _data_label(facts: RunFacts) -> str:
    """What the run read, in words: its data sets' names and its local data's file names."""
    named = [*facts.datasets, *(f"its own data ({f})" for f in _local_data(facts))]
    return ", ".join(named) or "data the run does not record"


def _local_data(facts: RunFacts) -> list[str]:
    """The file names of the local data the run read (a data set id would be a name)."""
    return [PurePath(v).name for v in facts.inputs if PurePath(v).is_absolute()]


def _card_data(
    facts: RunFacts, name: str, library: str, task: str | None, tags: list[str], measured: bool
) -> ModelCardData:
    """The card's metadata (:class:`huggingface_hub.ModelCardData`; module docstring)."""
    from huggingface_hub import ModelCardData

    results = _eval_results(facts, task) if measured and task else []
    summary = facts.summary
    qkv: dict[str, Any] = {
        "version": __version__,
        "recipe": facts.recipe,
        "model_type": facts.settings.get("model_type"),
        "model": facts.sizes,
        "parameters": facts.parameters,
        **{k: summary[k] for k in ("steps", "train_minutes") if k in summary},
    }
    every_tag = ["qkv", facts.recipe, *tags, task, "protein" if facts.protein else None]
    return ModelCardData(
        library_name=library,
        pipeline_tag=task,
        tags=[t for t in dict.fromkeys(every_tag) if t],
        datasets=facts.datasets or None,
        language=facts.language,
        base_model=_hub_origin(facts.settings.get("init")),
        model_name=name if results else None,
        eval_results=results or None,
        metrics=sorted({r.metric_type for r in results} & set(METRIC_IDS.values())) or None,
        qkv={k: v for k, v in qkv.items() if v is not None},
    )


def _intro(facts: RunFacts, what: str, how: str, name: str) -> list[str]:
    """The body's first sections: the title, what the model is, its sizes, how it was trained."""
    source = facts.settings.get("converted_from")
    origin = f"`{_published(source)}`, converted" if source else f"a qkv `{facts.recipe}` run"
    lines = [f"# {name}", "", f"{what}, written by {how} (qkv {__version__}) from {origin}.", ""]
    lines += ["## Model", "", "| | |", "|---|---|"]
    lines += [f"| `{k}` | {v:,} |" for k, v in facts.sizes.items()]
    lines += [f"| parameters | {facts.parameters:,} |"]
    if facts.tokenizer is not None:
        lines += [
            f"| tokenizer | {_tokenizer_kind(facts.tokenizer)}, {facts.tokenizer.vocab_size:,} tokens |"
        ]
    lines += ["", "## Training", "", _trained(facts), ""]
    return lines


def _tokenizer_kind(tok: Any) -> str:
    """A tokenizer in words."""
    if isinstance(tok, CharTokenizer):
        return "qkv's character tokenizer"
    if isinstance(tok, AminoAcidTokenizer):
        return "qkv's amino-acid tokenizer"
    if isinstance(tok, SubwordTokenizer):
        return "qkv's byte-pair encoding, a `tokenizers` file"
    return "the original model's tokenizer, a `tokenizers` file"


def _trained(facts: RunFacts) -> str:
    """How the model came to be, from ``train_config.json`` and ``summary.json``."""
    s, summary = facts.settings, facts.summary
    if s.get("converted_from"):
        return (
            f"Converted from `{_published(s['converted_from'])}` by `qkv convert hf`; not trained by "
            "qkv. Its training and data are the original model's."
        )
    text = f"Trained by qkv's `{facts.recipe}` recipe"
    if s.get("init"):
        text += f", starting from `{_published(s['init'])}`"
    text += f", on {_data_label(facts)}"
    if "steps" in summary:
        text += (
            f": {summary['steps']:,} optimizer steps, {summary.get('train_minutes', 0):.1f} min of training"
        )
    device = (s.get("resolved") or {}).get("device")
    return text + (f" (on {device})." if device else ".")


def _results(facts: RunFacts, measured: bool) -> list[str]:
    """The figures the run recorded (``summary.json``), as a table."""
    figures = _figures(facts.summary)
    if not figures:
        return []
    lines = ["## Results", "", "Measured by the qkv run (its `summary.json`):", ""]
    lines += ["| split | metric | value |", "|---|---|---|"]
    counts = {SPLITS[k]: v["n"] for k, v in facts.summary.items() if k in SPLITS and "n" in (v or {})}
    shown = {
        split: f"{split} (n = {counts[split]:,})" if split in counts else split for split, _, _ in figures
    }
    lines += [f"| {shown[split]} | `{name}` | {value:.6g} |" for split, name, value in figures]
    if not measured:
        lines += [
            "",
            "These figures are of the run's task head, which this export does not hold: they are "
            "not in the card's `model-index`.",
        ]
    return [*lines, ""]


def _tokenizer_lines(facts: RunFacts, source: str) -> tuple[list[str], list[str]]:
    """``(imports, statements)`` of the snippet's tokenizer read from ``source`` (a Python
    expression: the folder): transformers' fast tokenizer for a ``tokenizers`` file; for qkv's
    own vocabularies, a comment sending the reader to ``qkv.load``."""
    tok = facts.tokenizer
    if tok is None:
        return [], ["# no tokenizer: the model reads images (pixel values)"]
    if isinstance(tok, (HFTokenizer, SubwordTokenizer)):
        return (
            ["from transformers import PreTrainedTokenizerFast"],
            [f"tokenizer = PreTrainedTokenizerFast.from_pretrained({source})"],
        )
    return [], [f"# tokenizer.json is {_tokenizer_kind(tok)}: qkv.load({source}) reads it"]


def _qkv_lines(where: str, name: str) -> list[str]:
    """How qkv loads the folder: in memory, or as a run directory for qkv's commands."""
    return [
        "With qkv (an HF folder or a Hub name, converted in memory):",
        "",
        "```python",
        "import qkv",
        "",
        f'model, tokenizer = qkv.load("{where}")',
        "```",
        "",
        f"or as a run directory for qkv's commands: `qkv convert hf {where} runs/{name}`.",
        "",
    ]


def _limits(facts: RunFacts, head_left_out: bool) -> list[str]:
    """The card's limits: what the model was trained on, and what the export leaves out."""
    lines = ["## Limits", ""]
    if facts.settings.get("converted_from"):
        lines.append("- A conversion: the original model's limits are this one's.")
    else:
        lines.append(
            f"- An educational model made with qkv, a teaching toolkit: trained on {_data_label(facts)} "
            "only, and evaluated only as recorded above; not tested for any other use."
        )
    if head_left_out:
        lines.append(
            "- The run's classification head has no counterpart in this architecture and is not in "
            "this export (`qkv convert --to peft` keeps a LoRA run's head)."
        )
    return [*lines, ""]


def _published(value: Any) -> Any:
    """``value`` (a setting, or a tree of them) as a public card shows it: a local absolute
    path by its last part."""
    if isinstance(value, dict):
        return {k: _published(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_published(v) for v in value]
    if isinstance(value, str) and PurePath(value).is_absolute():
        return PurePath(value).name
    return value


def _card(data: Any, lines: list[str], facts: RunFacts) -> ModelCard:
    """The card of ``data`` (metadata) and body ``lines`` plus the settings block, parsed back
    as ``huggingface_hub`` parses it (:func:`check_card`'s checks) before anything is written.

    Raises:
        QkvError: the text does not parse back to the same metadata.
    """
    from huggingface_hub import ModelCard

    settings = json.dumps(_published(facts.settings), indent=2, ensure_ascii=False)
    summary = "<summary>train_config.json: the settings as resolved (a local path by its last part)</summary>"
    lines += ["## Settings", "", "<details>", summary, "", "```json", settings, "```", "", "</details>", ""]
    text = f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)
    try:
        card = ModelCard(text)
    except ValueError as exc:
        raise QkvError(f"the model card does not parse: {_first_line(exc)}") from None
    if card.data.to_dict() != data.to_dict():
        raise QkvError("the model card's metadata does not parse back as written")
    return card
