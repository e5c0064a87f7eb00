"""Run directories: the one home of what a training run leaves behind.

- :mod:`qkv.runs.layout`: the names of a run's files, the paths a run records, and which
  weights a finished run's model comes from (:func:`~qkv.runs.layout.select_weights`);
- :mod:`qkv.runs.info`: reading them (:class:`RunInfo`: the recipe, the architecture, the
  settings; :func:`run_json` for any other file of a run);
- :mod:`qkv.runs.record`: checking a directory before a run writes into it, and recording its
  settings, inputs and provenance;
- :mod:`qkv.runs.load`: a run's model and tokenizer (:func:`load_run`), for any family.

It sits below :mod:`qkv.train` because inference, the explainers and the hub read runs too and
must not depend on the training machinery; the training state's own file is
:mod:`qkv.train.train_state`'s.
"""

from .info import RunInfo, model_type_of, resumed_json, run_header, run_json, run_recipe, run_settings
from .load import load_run

__all__ = [
    "RunInfo",
    "load_run",
    "model_type_of",
    "resumed_json",
    "run_header",
    "run_json",
    "run_recipe",
    "run_settings",
]
