"""Recipes: one module per task that qkv trains, each a recipe.

A recipe wires a data set (:mod:`qkv.data`), a model family (:mod:`qkv.models`) and the run's
flow (:mod:`qkv.train.run`) for one task: translation (and its recurrent baseline), language
modelling (autoregressive and masked diffusion), protein pretraining and classification, text
classification, image classification and captioning. Its module states only what is the task's
own: a frozen ``*Settings`` dataclass (what ``qkv train NAME`` resolves), a
:class:`~qkv.train.run.TrainingRun` subclass (setup, model, batches, loss, validation,
summary), ``evaluate_run`` (``qkv evaluate``), and one exported
:class:`~qkv.recipes.recipe.Recipe` record that names them, its model type, its explainer and
the kind of input it reads.

Beside them: :mod:`~qkv.recipes.recipe` (the record), :mod:`~qkv.recipes.registry` (the one
place that lists every recipe by name, which the command line asks),
:mod:`~qkv.recipes.loading` (a run directory's explainer, the one its recipe names),
:mod:`~qkv.recipes.encoder` (a converted pretrained encoder: a kind of run without training) and
:mod:`~qkv.recipes.common` (the pretrained encoder with a new head that the classification
recipes fine-tune). Nothing but the registry and the command line imports a recipe module.
"""
