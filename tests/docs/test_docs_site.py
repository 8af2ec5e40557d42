"""The documentation site (mkdocs.yml, docs/): it builds with ``mkdocs build --strict`` (a broken
link, a page missing from the nav or an API reference that cannot be resolved fails), and its API
reference covers every public name of the lazily exported packages."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "reference"


@pytest.mark.slow
def test_the_docs_site_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip('mkdocs and mkdocstrings are not installed (pip install -e ".[docs]"); the strict docs build was not checked')
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    site = tmp_path / "site"
    assert (site / "index.html").is_file()
    runtime = (site / "reference" / "runtime" / "index.html").read_text()
    assert "run_experiment" in runtime and "RunSummary" in runtime  # rendered from the docstrings
    assert ":func:`" not in runtime and ":class:`" not in runtime  # docs/hooks.py turned the roles into code


def directives() -> dict[str, str]:
    """Every ``::: target`` of the API reference pages, with the options block under it."""
    found = {}
    for page in REFERENCE.glob("*.md"):
        for match in re.finditer(r"^::: (\S+)\n((?:    .*\n)*)", page.read_text(), flags=re.M):
            found[match.group(1)] = match.group(2)
    return found


def documented(name: str, module: str, found: dict[str, str]) -> bool:
    """``module.name`` has a directive of its own, or ``module`` has one listing it (or listing all members)."""
    if f"{module}.{name}" in found:
        return True
    options = found.get(module)
    if options is None or "members: false" in options:
        return False
    members = re.findall(r"^\s+- (\S+)$", options, flags=re.M)
    return not members or name in members


def modules_of(name: str, module: str) -> list[str]:
    """The modules a public name can be documented at: the one a package's ``_API`` names, the ones
    that module's own ``_API`` forwards it to, and where its class or function is defined."""
    chain = [module]
    while name in getattr(importlib.import_module(chain[-1]), "_API", {}):
        forwarded = importlib.import_module(chain[-1])._API[name]
        if forwarded in chain:
            break
        chain.append(forwarded)
    defined_in = getattr(getattr(importlib.import_module(chain[-1]), name), "__module__", None)
    return chain + ([defined_in] if isinstance(defined_in, str) else [])


@pytest.mark.parametrize("package", ["fedray", "fedray.runtime", "fedray.tracking"])
def test_the_api_reference_covers_every_public_name(package):
    """These packages export their names lazily (``_API``: name -> module), which the static
    reference cannot see by itself: each name needs a directive of its own, or one of a module that
    defines or re-exports it, on a page of docs/reference/."""
    api: dict[str, str] = importlib.import_module(package)._API
    found = directives()
    missing = [
        f"{package}.{name}"
        for name, module in api.items()
        if not any(documented(name, candidate, found) for candidate in modules_of(name, module))
    ]
    assert not missing, f"add these to docs/reference/*.md: {missing}"
