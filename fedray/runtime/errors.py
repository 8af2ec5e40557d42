"""The ways a run ends early that the CLI reports as one line (torch-free, so that the code which
starts Ray can raise them before torch is imported)."""

from __future__ import annotations


class RunError(RuntimeError):
    """A run failed for a reason the message states in one line (with what to do about it)."""

    fedray_exit_code = 1  # the CLI prints the message alone and exits with this code


class TrainingDiverged(RunError):
    """Every client update of a round was non-finite: the model is no longer being trained."""

    def __init__(self, message: str, round: int) -> None:
        super().__init__(message)
        self.round = round

    def __reduce__(self) -> tuple[type, tuple[str, int]]:  # Ray pickles it out of a Tune trial
        return type(self), (str(self), self.round)


class UserCodeError(RunError):
    """User code (a plug-in algorithm's method, an ``output.callbacks`` callback) raised, or returned
    what the runtime cannot use. The message names where (``owner``, ``method``, ``round``,
    ``client``) and what (``problem``), then what the run directory allows (``hint``, added by the
    driver); ``user_frames`` is the traceback of the user's call only (not Ray's or the runtime's),
    which the CLI prints below the message."""

    def __init__(
        self, owner: str, method: str, round: int | None, client: int | None, problem: str, user_frames: str = "", hint: str = ""
    ) -> None:
        self.owner, self.method, self.round, self.client = owner, method, round, client
        self.problem, self.user_frames, self.hint = problem, user_frames, hint
        where = ", ".join(f"{name} {value}" for name, value in (("client", client), ("round", round)) if value is not None)
        super().__init__(f"{owner}: {method}{f' ({where})' if where else ''} {problem}" + (f"; {hint}" if hint else ""))

    def with_hint(self, hint: str) -> UserCodeError:
        """The same error, saying ``hint`` (what to do with the run directory) after the problem."""
        return UserCodeError(self.owner, self.method, self.round, self.client, self.problem, self.user_frames, hint)

    def __reduce__(self) -> tuple[type, tuple]:  # Ray pickles it out of a worker or the server actor
        return type(self), (self.owner, self.method, self.round, self.client, self.problem, self.user_frames, self.hint)


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the driver; ``message`` says how to resume."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def first_line(error: BaseException) -> str:
    """The first line of an error's message (at most 300 characters), or its class name."""
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


def innermost_cause(error: BaseException) -> BaseException:
    """The exception raised where the error happened: Ray wraps one raised in an actor (a worker, the
    server actor) in a ``RayTaskError`` whose ``cause`` it is, once per actor it passed through."""
    while isinstance(getattr(error, "cause", None), BaseException):
        error = error.cause
    return error
