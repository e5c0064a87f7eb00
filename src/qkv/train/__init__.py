"""The training loop and its pieces: the run's flow (:mod:`~qkv.train.run`), the loop
(:mod:`~qkv.train.loop`), one step, losses, optimiser and schedule, metrics, checkpoints and
the training state's file, adapters, and the dry run."""
