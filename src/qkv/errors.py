"""qkv's error policy, in one place.

- :class:`QkvError` (and its subclasses) is a problem with the user's input: a file, a value,
  an option, an empty text, a run directory of the wrong kind. The message is one line that
  names the thing; the CLI prints it as ``error: ...`` and exits with status 2.
- :class:`InputTooLong` is a :class:`QkvError` for an input over a model's context or a cap
  (the explainer servers answer it with 413, every other user error with 422).
- :class:`ConfigError` is a :class:`QkvError` that is also a ``ValueError``: a configuration
  value out of range or of the wrong type, raised where a Python user expects ``ValueError``
  (constructing a config dataclass) and shown by the CLI like any other user error.
- ``OSError`` is the environment (a missing file, a full disk, no permission): the CLI shows
  its one line and exits with status 2 too.
- Any other exception is a bug in qkv: the CLI says so in one line, with how to report it, and
  exits with status 1; ``qkv --debug`` shows the traceback.
"""


class QkvError(Exception):
    """A problem with the user's input, files or configuration, stated in one line."""


class InputTooLong(QkvError):
    """An input longer than a model's context or a cap (characters, tokens), stated in one line."""


class ConfigError(QkvError, ValueError):
    """A configuration value that is out of range, inconsistent or of the wrong type."""
