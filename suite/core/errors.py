"""User-facing errors: the CLI prints their message as one line and exits with status 2."""


class BenchError(Exception):
    """Bad input (file, field, name). The message names the file or field at fault."""
