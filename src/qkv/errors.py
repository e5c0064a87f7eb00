"""The one exception type the CLI turns into a one-line message (no traceback)."""


class QkvError(Exception):
    """A problem with the user's input, files or configuration, stated in one line."""
