"""User-facing errors: the CLI prints their message as one line and exits with status 2."""


class BenchError(Exception):
    """Bad input (file, field, name). The message names the file or field at fault."""


class RunFailed(Exception):
    """`run`: training or evaluation raised; the traceback is in the run's status.json and run.log (exit status 1)."""
