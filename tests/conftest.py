"""Shared fixtures. One real local Ray instance per test session (started on first use), small data.

The tests mirror the package (``tests/algorithms/``, ``tests/runtime/``, ...). Shared helpers are
modules here (``e2e_helpers``, ``fault_injection``, ``federation_helpers``, ``preloaded_cli``) and a few test modules that
others import from (``test_bad_inputs.assert_rejected``, ``test_personalized.simulate``, ...): every
test folder is put on the import path, so such an import works from any folder."""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

_TESTS = Path(__file__).resolve().parent
for _folder in sorted(path for path in _TESTS.iterdir() if path.is_dir() and path.name.isidentifier() and any(path.glob("test_*.py"))):
    sys.path.insert(0, str(_folder))

torch.set_num_threads(1)

#: Fixtures that make a test slow by what they are (pyproject's ``slow`` marker): a real Ray, a real browser.
SLOW_FIXTURES = {"ray_session", "page"}


#: Seconds each scheduling unit took in a full run (scripts/test_durations.py writes it from a JUnit XML).
UNIT_SECONDS: dict[str, float] = json.loads((_TESTS / "durations.json").read_text())


class LongestFirst(OrderedDict):
    """A work queue whose next unit (``popitem(last=False)``, as xdist's scheduler takes it) is the one
    that took longest (:data:`UNIT_SECONDS`; an unlisted unit counts 0 and keeps the collection order):
    a long unit handed out last would keep one worker busy after the other has finished."""

    def popitem(self, last: bool = True):
        if last:
            return super().popitem(last=True)
        unit = max(self, key=lambda name: UNIT_SECONDS.get(name, 0.0))  # the first of the longest
        return unit, self.pop(unit)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """With ``-n``: a test file's tests (or an ``xdist_group``'s, across files) go to one worker as one
    unit, so that a module-scoped fixture (a sweep, a run, a browser) is built once, not once on each
    worker that runs one of its tests; the longest units first (:class:`LongestFirst`)."""
    from xdist.scheduler import LoadGroupScheduling

    class FileOrGroupScheduling(LoadGroupScheduling):
        def __init__(self, config: pytest.Config, log=None) -> None:
            super().__init__(config, log)
            self.workqueue = LongestFirst()

        def _split_scope(self, nodeid: str) -> str:
            group = super()._split_scope(nodeid)
            return group if group != nodeid else nodeid.split("::", 1)[0]

    return FileOrGroupScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses a real Ray or drives a real browser is in the slow tier, marked or not."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray (4 logical CPUs on this 2-core machine, no dashboard), shut down at the end."""
    import ray

    if not ray.is_initialized():
        # The suite keeps both CPUs busy, and this Ray stays up through it: no worker processes are
        # started before an actor needs one (Ray would start one per logical CPU, each then polling
        # for the rest of the session: 2.6 % of a core in all, idle). Ray's processes take the
        # variable from this process's environment (a job runtime_env would route every worker
        # through Ray's runtime-env wrapper).
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("PYTHONWARNINGS", "ignore::DeprecationWarning")
            ray.init(
                num_cpus=4,
                include_dashboard=False,
                object_store_memory=512 * 1024**2,
                log_to_driver=True,
                _system_config={"prestart_worker_first_driver": False},  # a Ray system setting (ray_config_def.h)
            )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def user_code_sweep(tmp_path_factory):
    """The real ``fedray tune`` sweep of user code (``user_code_sweep_rig``), made once for the session's tests
    that read it: those of ``tests/e2e/test_user_code_sweep.py`` and the dashboard's ``on_the_real_sweep``
    tests, all in the xdist group ``user_code_sweep_rig.XDIST_GROUP`` so that with ``-n`` one worker makes it."""
    from user_code_sweep_rig import make_user_code_sweep

    return make_user_code_sweep(tmp_path_factory.mktemp("user-code-sweep"))


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A real S3 API (moto's server) on a free loopback port, with dummy credentials in the environment."""
    pytest.importorskip("moto.server", reason="needs moto[server] (pip install -e '.[test]')")
    from fedray.testing.s3 import LocalS3

    previous = LocalS3.export_credentials()
    with LocalS3(tmp_path_factory.mktemp("s3")) as server:
        yield server
    LocalS3.restore(previous)


@pytest.fixture
def tiny_overrides(tmp_path) -> list[str]:
    """Overrides for a fast digits run that writes into the test's temporary directory."""
    return [
        f"output.dir={tmp_path}",
        "output.name=run",
        "data.num_clients=10",
        "train.clients_per_round=4",
        "train.rounds=4",
        "checkpoint.every=2",
        "output.tensorboard=false",
        "output.plots=false",
    ]
