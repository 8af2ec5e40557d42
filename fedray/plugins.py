"""User code a run config names: the algorithm (``algorithm.name: mylab.fedavgm:FedAvgM`` or an
installed entry point), callbacks (``output.callbacks``), data (``data.name: mylab.data:load``) and the
model (``model.name: mylab.nets:Net``, docs/guide/your_model.md).

- :func:`load_config` / :func:`build_config` / :func:`validate_plugins`: the complete validation of a
  run config (schema, the algorithm's ``Params``, the callbacks), done by the driver before Ray starts.
- :func:`user_module_paths`: the files or packages that hold that code (installed packages excluded).
- :func:`ship_user_modules`: uploads them to the Ray cluster and returns the ``runtime_env``
  (``py_modules``) under which the server actor runs; the workers it creates inherit it, so every
  process of the run imports the same class without ``PYTHONPATH``. A Tune trial is created by Tune,
  which takes no ``runtime_env``: ``fedray tune`` puts the same modules in the job's ``runtime_env``
  when it starts or connects to Ray (:func:`job_runtime_env`), and on a Ray someone else started
  checks first that the job can import them (:func:`check_ray_imports`).
"""

from __future__ import annotations

import copy
import site
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any, Iterable

from fedray.algorithms import get_algorithm_class, validate_algorithm_params
from fedray.config import ConfigError, RunConfig, apply_overrides, import_reference, is_reference, validate_config
from fedray.config import load_config_sections
from fedray.models.external import model_factory
from fedray.tracking.callbacks import config_callback_classes

#: Left out of a shipped package.
SHIP_EXCLUDES = ["__pycache__", "*.pyc", ".git"]


def validate_plugins(config: RunConfig) -> RunConfig:
    """``config`` with the algorithm's keys validated (defaults filled), every callback imported and
    checked and a user's model imported; raises :class:`fedray.config.ConfigError` naming the key."""
    config = validate_algorithm_params(config)
    config_callback_classes(config)
    external_model_factories(config)  # a user's model that does not import fails here, naming model.name
    return config


def external_model_factories(config: RunConfig) -> list[Any]:
    """The imported class or function of ``model.name`` when it names a model outside fedray
    (``package.module:Name``, ``torchvision:NAME``); empty for a built-in model."""
    return [model_factory(config.model.name)] if is_reference(config.model.name) else []


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> RunConfig:
    """Read a YAML run config (or start from the defaults), apply ``--set``-style ``overrides``
    (``["data.alpha=0.1"]``) and validate all of it, the algorithm's own keys included."""
    return validate_plugins(load_config_sections(path, overrides))


def build_config(raw: dict[str, Any] | None = None, overrides: Iterable[str] = ()) -> RunConfig:
    """A validated run config from a mapping of sections, e.g.
    ``build_config({"algorithm": {"name": "fedprox", "mu": 0.1}}, ["train.rounds=5"])``."""
    return validate_plugins(validate_config(apply_overrides(copy.deepcopy(raw or {}), overrides)))


def _installed_roots() -> list[Path]:
    roots = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")} | set(site.getsitepackages())
    return [Path(root).resolve() for root in roots]


def _top_level_source(module_name: str) -> Path | None:
    """The file (a one-file module) or directory (a package) of ``module_name``'s top-level package."""
    top = sys.modules.get(module_name.partition(".")[0])
    if top is None:
        return None
    file = getattr(top, "__file__", None)
    if file is not None:
        return Path(file).resolve().parent if hasattr(top, "__path__") else Path(file).resolve()
    paths = list(getattr(top, "__path__", []))  # a namespace package
    return Path(paths[0]).resolve() if len(paths) == 1 else None


def user_module_paths(config: RunConfig) -> list[str]:
    """Where the user code ``config`` names lives: one path per top-level package or module, except
    fedray's own and installed packages (which every node has)."""
    objects = [get_algorithm_class(config.algorithm.name), *config_callback_classes(config)]
    if is_reference(config.data.name):
        objects.append(import_reference(config.data.name, "data.name"))
    objects += external_model_factories(config)
    installed = _installed_roots()
    paths: dict[str, None] = {}
    for obj in objects:
        if obj.__module__.partition(".")[0] == "fedray":
            continue
        source = _top_level_source(obj.__module__)
        if source is not None and not any(source.is_relative_to(root) for root in installed):
            paths[str(source)] = None
    return list(paths)


def job_runtime_env(paths: Iterable[str]) -> dict[str, Any] | None:
    """A ``ray.init(runtime_env=...)`` that ships ``paths`` (local paths: Ray uploads them). It has no
    ``excludes``: inside a submitted job Ray merges it with the job's runtime_env, which has its own."""
    paths = list(paths)
    return {"py_modules": paths} if paths else None


def check_ray_imports(paths: Iterable[str]) -> None:
    """For a Ray that fedray did not start (so whose job ``runtime_env`` fedray did not set): raise
    :class:`ConfigError` unless a task of the current job can import the top-level modules at
    ``paths``, as Tune's trial processes will have to."""
    names = [Path(path).stem for path in paths]  # "…/mylab" -> mylab, "…/fedavgm.py" -> fedavgm
    if not names:
        return
    import ray

    @ray.remote(num_cpus=0)
    def unimportable(names: list[str]) -> list[str]:
        import importlib.util

        return [name for name in names if importlib.util.find_spec(name) is None]

    missing = ray.get(unimportable.remote(names))
    if missing:
        raise ConfigError(
            "algorithm.name / output.callbacks",
            "Ray was started without your module(s) "
            f"{', '.join(missing)}, which Tune's trials must import: let fedray start Ray, or start it with "
            f"ray.init(runtime_env={{'py_modules': {list(paths)!r}}})",
        )


def ship_user_modules(config: RunConfig) -> dict[str, Any] | None:
    """Upload the modules of :func:`user_module_paths` to the connected Ray cluster (content-addressed,
    so a second upload is a no-op) and return the actor ``runtime_env`` that makes them importable,
    or ``None`` when the config names no user code."""
    paths = user_module_paths(config)
    if not paths:
        return None
    # Actor runtime_envs take package URIs only; this is the function ray.init uses for local paths.
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed

    with tempfile.TemporaryDirectory() as scratch:
        runtime_env = upload_py_modules_if_needed(
            {"py_modules": paths, "excludes": SHIP_EXCLUDES}, include_gitignore=True, scratch_dir=scratch
        )
    return {"py_modules": runtime_env["py_modules"]}
