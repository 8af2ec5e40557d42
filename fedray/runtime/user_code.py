"""Where the runtime calls user code: a plug-in algorithm's methods and the ``output.callbacks``.

- :func:`call_algorithm`: the workers call ``client_update`` and the ``evaluate_*`` methods, the
  engine ``aggregate``, through it. What the method raises (``sys.exit`` included) or a result the
  runtime cannot use (a dict instead of a :class:`ClientUpdate`, Python floats among the sums)
  becomes one :class:`~fedray.runtime.errors.UserCodeError` naming the algorithm, the method, the
  client and the round, with the traceback of the user's call only; the driver adds whether the run
  can be continued, and the CLI prints it as one line (exit 1) with those frames below it.
- :func:`user_callbacks`: the ``output.callbacks``, built (before the run directory exists) and each
  wrapped in an :class:`IsolatedCallback`. A callback only observes a run: one that raises is
  reported and switched off, and the run goes on to the same results as without it. One that calls
  ``sys.exit`` stops the run (exit 1, with the resume command), never with exit 0 before its end.

A run whose user code neither raises nor returns a wrong result goes through here unchanged: the
checks only read the results.
"""

from __future__ import annotations

import inspect
import logging
import traceback
from typing import Any, Callable

import torch

from fedray.algorithms import Algorithm, ClientUpdate
from fedray.config import RunConfig
from fedray.runtime.errors import UserCodeError, first_line
from fedray.tasks import Task
from fedray.tracking import Callback, RunContext
from fedray.tracking.callbacks import config_callback_classes

logger = logging.getLogger(__name__)

#: Frames of the user's traceback printed below the error line (the innermost ones).
MAX_USER_FRAMES = 8


def call_algorithm(algorithm: Algorithm, method: str, round: int | None, client: int | None, *args: Any) -> Any:
    """``algorithm.<method>(*args)`` for ``client`` (None: a server-side call) in ``round``, with
    what it raises and a result of the wrong kind turned into a :class:`UserCodeError`."""
    owner = f"algorithm {algorithm.config.algorithm.name}"
    function = getattr(algorithm, method)
    try:
        result = function(*args)
    except (Exception, SystemExit) as error:
        raise user_code_error(owner, method, round, client, error) from None
    problem = RESULT_CHECKS[method](algorithm, result) if method in RESULT_CHECKS else None
    if problem is not None:
        raise UserCodeError(owner, method, round, client, problem, definition_frame(function))
    return result


def user_code_error(owner: str, method: str, round: int | None, client: int | None, error: BaseException) -> UserCodeError:
    """``error``, caught where the runtime called the user's ``method`` (the first frame of its
    traceback), as a :class:`UserCodeError` carrying the frames of that call inwards: the user's."""
    if isinstance(error, SystemExit):
        problem = f"called sys.exit({error.code!r})"
    else:
        problem = f"raised {type(error).__name__}: {first_line(error)}"
    frames = traceback.extract_tb(error.__traceback__)[1:]  # [0] is the runtime's call of the method
    shown = "".join(traceback.format_list(frames[-MAX_USER_FRAMES:]))
    if len(frames) > MAX_USER_FRAMES:
        shown = f"  ... {len(frames) - MAX_USER_FRAMES} outer frame(s) left out\n" + shown
    return UserCodeError(owner, method, round, client, problem, shown)


def definition_frame(function: Callable[..., Any]) -> str:
    """Where ``function`` is defined, as a traceback line (for a wrong result, which has no traceback)."""
    function = inspect.unwrap(function)
    try:
        path, line = inspect.getsourcefile(function), inspect.getsourcelines(function)[1]
    except (OSError, TypeError):
        return ""
    return "".join(traceback.format_list([traceback.FrameSummary(path, line, function.__name__, line=None)]))


def _type_name(value: Any) -> str:
    return type(value).__name__


def check_client_update(update: Any) -> str | None:
    """What is wrong with a ``client_update`` result (None: nothing the runtime would trip over)."""
    if not isinstance(update, ClientUpdate):
        return f"returned a {_type_name(update)}, not a fedray.ClientUpdate(sums=..., metrics=...)"
    if not isinstance(update.sums, dict):
        return f"returned sums of type {_type_name(update.sums)}: sums must be a dict of tensors"
    for name, value in update.sums.items():
        if not isinstance(value, torch.Tensor):
            return f"returned sums[{name!r}] of type {_type_name(value)}: every sum must be a torch tensor (e.g. torch.tensor(float(n)))"
    return None


def check_aggregate(result: Any) -> str | None:
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], dict) and isinstance(result[1], dict)):
        return f"returned a {_type_name(result)}, not a (server_state dict, metrics dict) pair"
    return None


def _check_sums(keys_of: Callable[[Task], tuple[str, ...]]) -> Callable[[Algorithm, Any], str | None]:
    """A check of an evaluation result: a dict with at least the sums ``keys_of(algorithm.task)`` names."""

    def check(algorithm: Algorithm, result: Any) -> str | None:
        if not isinstance(result, dict):
            return f"returned a {_type_name(result)}, not a dict of metric sums"
        missing = [key for key in keys_of(algorithm.task) if key not in result]
        return f"returned no {', '.join(missing)} (it returned {sorted(result)})" if missing else None

    return check


#: The result checks of the algorithm methods the runtime calls through :func:`call_algorithm`.
RESULT_CHECKS: dict[str, Callable[[Algorithm, Any], str | None]] = {
    "client_update": lambda algorithm, result: check_client_update(result),
    "aggregate": lambda algorithm, result: check_aggregate(result),
    "evaluate_global": _check_sums(lambda task: task.sum_keys),
    "evaluate_client": _check_sums(lambda task: task.client_sum_keys),
    "evaluate_on_test_set": _check_sums(lambda task: ()),
}


class IsolatedCallback(Callback):
    """A callback of ``output.callbacks`` (``reference``), which cannot change the run it observes:
    the first exception it raises is logged as a warning (naming it, the hook and the round, with
    its frames) and its hooks are not called again; the run goes on. A ``sys.exit`` in it stops
    the run with a :class:`UserCodeError` (exit 1 and the resume command)."""

    def __init__(self, reference: str, callback: Callback) -> None:
        self.reference = reference
        self.callback = callback
        self.failed = False

    def on_run_start(self, run: RunContext) -> None:
        self._call("on_run_start", None, run)

    def on_round_end(self, run: RunContext, row: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        self._call("on_round_end", row["round"], run, row, client_rows)

    def on_run_end(self, run: RunContext) -> None:
        self._call("on_run_end", None, run)

    def _call(self, hook: str, round: int | None, *args: Any) -> None:
        if self.failed:
            return
        try:
            getattr(self.callback, hook)(*args)
        except SystemExit as error:
            raise user_code_error(f"callback {self.reference}", hook, round, None, error) from None
        except Exception as error:
            self.failed = True
            report = user_code_error(f"callback {self.reference}", hook, round, None, error)
            logger.warning(
                "warning: %s; the callback is switched off for the rest of the run, which goes on\n%s",
                report,
                report.user_frames.rstrip("\n"),
            )


def user_callbacks(config: RunConfig) -> list[Callback]:
    """The ``output.callbacks`` of ``config``, built and wrapped in :class:`IsolatedCallback`; an
    ``__init__`` that raises is a :class:`UserCodeError` (their signatures were checked with the
    config: they take no arguments)."""
    callbacks: list[Callback] = []
    for reference, cls in zip(config.output.callbacks, config_callback_classes(config)):
        try:
            callback = cls()
        except (Exception, SystemExit) as error:
            raise user_code_error(f"callback {reference}", "__init__", None, None, error) from None
        callbacks.append(IsolatedCallback(reference, callback))
    return callbacks
