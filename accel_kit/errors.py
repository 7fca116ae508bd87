"""User-facing errors: the CLI prints ``accel-kit: error: <message>`` and exits with status 2;
a notebook cell shows the same line instead of a traceback.

Raise these for anything the user can fix (a bad parameter, a missing file, an unavailable
system); let genuine bugs raise ordinary exceptions with their tracebacks.
"""


class AccelKitError(Exception):
    """A problem with the user's input or environment, explained in one line."""

    def _render_traceback_(self) -> list[str]:
        # IPython shows what this returns instead of the traceback: a notebook (and papermill's
        # report of the failed cell) ends with the same one line the CLI prints.
        return [f"accel-kit: error: {self}"]


class ParameterError(AccelKitError, ValueError):
    """A study parameter is unknown, of the wrong type, or out of range."""


class UnavailableError(AccelKitError, RuntimeError):
    """A system or device cannot be used on this machine (with the reason)."""


class DataError(AccelKitError, ValueError):
    """An input file (corpus, FASTA, results) is missing or malformed."""


class OutputError(AccelKitError):
    """An output (records, a figure, a report, a result file) could not be written: a full disk or
    quota, a read-only filesystem, no permission, or its folder removed while the run went on.

    ``path`` is the file or folder named in the message; ``errno`` the operating system's error.
    """

    def __init__(self, message: str, path: str = "", errno: int | None = None):
        super().__init__(message)
        self.path, self.errno = path, errno
