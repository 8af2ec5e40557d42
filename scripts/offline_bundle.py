#!/usr/bin/env python3
"""Build a folder of wheels that installs fedray on a GPU host without internet (issue 46, item 1).

Run it on a machine that reaches the package registry. The folder holds fedray's own wheel and every
dependency the GPU host lacks, for the host's Python and platform (default CPython 3.12, manylinux
x86_64). What the host already has (PyTorch, NumPy, pandas, ... — the names in ``--host-packages``)
is left out, and pip uses the host's copies. Ray's wheel is slimmed: the parts fedray never imports
(the Java worker jar, RLlib, Serve, Ray LLM) are removed and the wheel's RECORD is rewritten, so pip
installs it as usual. The folder must stay under ``--max-mib`` (60 MiB: what one upload to a GPU
host carries here).

    python scripts/offline_bundle.py                                  # -> dist/offline/ for CPython 3.12
    python scripts/offline_bundle.py --host-packages host.txt         # what YOUR host has:
                                                                      #   python3 -m pip list --format=freeze > host.txt
    python scripts/offline_bundle.py --json docs/results/raw/offline_bundle.json   # and its raw output (the README's size)
    python scripts/offline_bundle.py --python-version 3.11 --check    # for this machine's Python, then
        # install it into a fresh virtual environment that holds only the host's packages, with
        # --no-index, and run `fedray run` and a 2-trial `fedray tune` from there

On the GPU host (the line is also written to the folder's INSTALL.txt):

    python3 -m pip install --no-index --find-links offline/ fedray
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
DEFAULT_HOST_PACKAGES = REPO / "scripts" / "hosts" / "cuda-pytorch-image.txt"
# Parts of Ray's wheel that a fedray run never imports: the Java worker, RLlib, Serve, Ray LLM, and the
# source maps of Ray's dashboard page.
RAY_PARTS_DROPPED = ("ray/jars/", "ray/rllib/", "ray/serve/", "ray/llm/")
RAY_SUFFIXES_DROPPED = (".js.map",)
# pip matches a manylinux tag exactly: list the glibc versions a wheel may be built for.
MANYLINUX_TAGS = [f"manylinux_2_{minor}_x86_64" for minor in range(39, 16, -1)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]


def read_host_packages(path: Path) -> dict[str, str | None]:
    """``{canonical name: pinned version or None}`` from a ``pip list --format=freeze`` file (or a list of
    names, one per line; ``#`` comments allowed)."""
    packages: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        if " @ " in line:  # `name @ file:///...`: installed from a local path, version unknown
            packages[canonicalize_name(line.split(" @ ", 1)[0])] = None
            continue
        name, _, version = line.partition("==")
        packages[canonicalize_name(name)] = version.split("+", 1)[0] or None
    return packages


def wheel_project(wheel: Path) -> str:
    return canonicalize_name(wheel.name.split("-", 1)[0])


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim_ray_wheel(wheel: Path, out_dir: Path) -> Path:
    """A copy of Ray's wheel without :data:`RAY_PARTS_DROPPED`, its RECORD rewritten (a wheel's RECORD
    lists every file with its hash; pip refuses a wheel whose RECORD names files it lacks)."""
    out = out_dir / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as slim:
        record_name = next(name for name in source.namelist() if name.endswith(".dist-info/RECORD"))
        record = []
        for info in source.infolist():
            dropped = info.filename.startswith(RAY_PARTS_DROPPED) or info.filename.endswith(RAY_SUFFIXES_DROPPED)
            if dropped or info.filename == record_name:
                continue
            data = source.read(info.filename)
            slim.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            record.append(record_line(info.filename, data))
        record.append(f"{record_name},,")
        slim.writestr(record_name, "\n".join(record) + "\n")
    return out


def requirements(wheel: Path, extras: list[str]) -> list[Requirement]:
    """The ``Requires-Dist`` lines of a wheel that no extra guards, and those of ``extras``."""
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read(next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    requirements = [Requirement(line.split(":", 1)[1].strip()) for line in text.splitlines() if line.startswith("Requires-Dist:")]
    environment = default_environment()
    return [
        r for r in requirements if r.marker is None or any(r.marker.evaluate({**environment, "extra": extra}) for extra in ["", *extras])
    ]


def run(command: list[str | Path], **kwargs) -> None:
    print("+", " ".join(map(str, command)), flush=True)
    subprocess.run(command, check=True, **kwargs)


def build_bundle(out_dir: Path, python_version: str, host: dict[str, str | None], extras: list[str], max_mib: float) -> list[Path]:
    """Write the bundle into ``out_dir``; returns its wheels. Exits 1 (saying which wheels weigh most)
    when the folder is over ``max_mib``."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="fedray-bundle-") as scratch:
        scratch = Path(scratch)
        run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out_dir), str(REPO)])
        fedray_wheel = next(out_dir.glob("fedray-*.whl"))
        missing = [str(r) for r in requirements(fedray_wheel, extras) if canonicalize_name(r.name) not in host]
        constraints = scratch / "host-constraints.txt"
        constraints.write_text("".join(f"{name}=={version}\n" for name, version in host.items() if version))
        if missing:
            platform = [flag for tag in MANYLINUX_TAGS for flag in ("--platform", tag)]
            target = ["--python-version", python_version, "--implementation", "cp", "--only-binary=:all:", *platform]
            run([sys.executable, "-m", "pip", "download", "-q", "-d", str(scratch / "wheels"), *target, "-c", str(constraints), *missing])
        for wheel in sorted((scratch / "wheels").glob("*.whl")):
            project = wheel_project(wheel)
            if project in host:
                continue
            if project == "ray":
                slim_ray_wheel(wheel, out_dir)
            else:
                shutil.copy2(wheel, out_dir)
    (out_dir / "INSTALL.txt").write_text(
        "Install fedray on this host (no internet needed):\n\n"
        f"    python3 -m pip install --no-index --find-links {out_dir.name}/ {install_name(extras)}\n\n"
        f"Built for CPython {python_version}, manylinux x86_64, for a host that already has:\n"
        + "".join(f"    {name}{'==' + version if version else ''}\n" for name, version in sorted(host.items()))
    )
    wheels = sorted(out_dir.glob("*.whl"), key=lambda path: -path.stat().st_size)
    total = sum(path.stat().st_size for path in out_dir.iterdir()) / 2**20
    for wheel in wheels:
        print(f"  {wheel.stat().st_size / 2**20:6.1f} MiB  {wheel.name}")
    print(f"{out_dir}: {len(wheels)} wheels, {total:.1f} MiB (limit {max_mib:g} MiB)")
    if max_mib and total > max_mib:
        sys.exit(f"offline_bundle: {total:.1f} MiB is over --max-mib {max_mib:g}; the largest wheels are listed above")
    return wheels


def write_raw_output(args: argparse.Namespace, argv: list[str] | None, wheels: list[Path]) -> None:
    """The bundle's raw output to ``args.json``: benchmarks/raw_output.py's provenance and command line,
    each wheel's size and the folder's total (the README's figure)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from raw_output import raw_report, write_raw

    report = raw_report(args, argv)
    report["wheels_mib"] = {wheel.name: wheel.stat().st_size / 2**20 for wheel in wheels}
    report["total_mib"] = sum(path.stat().st_size for path in args.out.iterdir()) / 2**20
    write_raw(args.json, report)
    print(f"raw output in {args.json}")


def install_name(extras: list[str]) -> str:
    return f"'fedray[{','.join(extras)}]'" if extras else "fedray"


def host_closure(names: set[str]) -> set[str]:
    """The names, and everything this Python's installed distributions of them require (with the
    extras each requirement asks for), recursively."""
    environment = default_environment()
    closure: set[str] = set()
    seen: set[tuple[str, str]] = set()
    pending = [(name, "") for name in names]
    while pending:
        name, extra = pending.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        closure.add(name)
        for line in distribution.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({**environment, "extra": extra}):
                required = canonicalize_name(requirement.name)
                pending += [(required, "")] + [(required, wanted) for wanted in requirement.extras]
    return closure


def link_host_packages(names: set[str], host_dir: Path) -> None:
    """Emulate a host that has exactly ``names`` installed: link those distributions (their packages,
    modules and ``.dist-info``) from this Python into ``host_dir``."""
    host_dir.mkdir(parents=True)
    for name in sorted(names):
        distribution = metadata.distribution(name)
        site = Path(distribution.locate_file(""))
        tops = {Path(str(file)).parts[0] for file in distribution.files or [] if not str(file).startswith("..")}
        tops.add(Path(distribution._path).name)  # the .dist-info folder
        for top in tops:
            if (site / top).exists() and not (host_dir / top).exists():
                (host_dir / top).symlink_to(site / top)


def check_bundle(out_dir: Path, host: dict[str, str | None], extras: list[str]) -> None:
    """Install the bundle with ``--no-index`` into a fresh virtual environment that sees only the host's
    packages, then run ``fedray run`` and a 2-trial ``fedray tune`` from it."""
    with tempfile.TemporaryDirectory(prefix="fedray-bundle-check-") as scratch:
        scratch = Path(scratch)
        venv, host_dir = scratch / "venv", scratch / "host-site-packages"
        link_host_packages(host_closure(set(host)), host_dir)
        # Without pip and setuptools of its own: the host's (linked above) are the ones the host has.
        run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
        python = venv / "bin" / "python"
        site = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], capture_output=True, text=True, check=True
        )
        Path(site.stdout.strip(), "host-packages.pth").write_text(f"{host_dir}\n")
        # As on the host: no index, and none of this machine's pip settings (its find-links, constraints).
        environment = {key: value for key, value in os.environ.items() if not key.startswith("PIP_") and key != "PYTHONPATH"}
        environment |= {"PIP_CONFIG_FILE": os.devnull, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}
        install = [python, "-m", "pip", "install", "-q", "--no-index", "--find-links", out_dir, install_name(extras).strip("'")]
        run(install, env=environment)
        fedray = str(venv / "bin" / "fedray")
        work = scratch / "work"
        work.mkdir()
        quick = ["--set", "train.rounds=3", "--set", "output.dir=runs"]
        run([fedray, "run", *quick, "--set", "resources.num_workers=2"], cwd=work, env=environment)
        sweep = work / "sweep.yaml"
        sweep.write_text(
            "name: bundle-check\nbase: {train: {rounds: 2}}\nmetric: test_accuracy\nspace:\n  train.lr: {grid: [0.01, 0.05]}\n"
        )
        run([fedray, "tune", sweep, "--max-concurrent", "1"], cwd=work, env=environment)
        located = subprocess.run(
            [python, "-c", "import fedray, ray; print(fedray.__file__, ray.__file__)"], capture_output=True, text=True, env=environment
        )
        print(f"bundle check passed: fedray run and a 2-trial fedray tune ran from {venv} ({located.stdout.strip()})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "dist" / "offline", help="the bundle folder (replaced)")
    parser.add_argument("--python-version", default="3.12", help="the GPU host's Python, e.g. 3.12")
    parser.add_argument("--host-packages", type=Path, default=DEFAULT_HOST_PACKAGES, help="what the host already has")
    parser.add_argument("--extras", default="", help="fedray extras to include, comma-separated (e.g. cluster: Ray's job server)")
    parser.add_argument("--max-mib", type=float, default=60.0, help="fail when the bundle is larger (0: no limit)")
    parser.add_argument("--check", action="store_true", help="install it in a fresh venv and run fedray from it (this machine's Python)")
    parser.add_argument(
        "--json",
        type=Path,
        help="also write the raw output (provenance, each wheel's size, the total) here, e.g. docs/results/raw/offline_bundle.json",
    )
    args = parser.parse_args(argv)
    if not args.host_packages.is_file():
        parser.error(f"--host-packages: no file {args.host_packages}")
    if not re.fullmatch(r"3\.\d+", args.python_version):
        parser.error(f"--python-version: expected 3.N, got {args.python_version!r}")
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if args.check and args.python_version != here:
        parser.error(f"--check installs into this machine's Python {here}: add --python-version {here}")
    host = read_host_packages(args.host_packages)
    extras = [extra.strip() for extra in args.extras.split(",") if extra.strip()]
    wheels = build_bundle(args.out, args.python_version, host, extras, args.max_mib)
    if args.json:
        write_raw_output(args, argv, wheels)
    if args.check:
        check_bundle(args.out, host, extras)
    return 0


if __name__ == "__main__":
    sys.exit(main())
