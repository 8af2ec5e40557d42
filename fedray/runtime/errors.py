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


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the driver; ``message`` says how to resume."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def first_line(error: BaseException) -> str:
    """The first line of an error's message (at most 300 characters), or its class name."""
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__
