"""What ``fedray submit`` uploads: never what a link points at outside the working directory, no link
loops, no data/, sweeps/, runs/ or .env by default; checked against Ray's own packer."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from ray._private.runtime_env.packaging import create_package

from fedray.cluster.jobs import plan_upload


@pytest.fixture
def working_dir(tmp_path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "id_rsa").write_text("secret key")
    work = tmp_path / "work"
    for folder in ("configs", "data", "sweeps", "runs/r1", "fedray/data"):
        (work / folder).mkdir(parents=True)
    (work / "configs" / "run.yaml").write_text("train: {rounds: 2}\n")
    (work / "fedray" / "data" / "loader.py").write_text("# a package folder named data, below the top\n")
    (work / "data" / "cifar.bin").write_bytes(b"0" * 1000)
    (work / "sweeps" / "meta.json").write_text("{}")
    (work / "runs" / "r1" / "metrics.parquet").write_bytes(b"rows")
    (work / ".env").write_text("AWS_SECRET_ACCESS_KEY=x\n")
    (work / "configs" / "leak").symlink_to(outside / "id_rsa")  # a file link leaving the folder
    (work / "configs" / "home").symlink_to(outside)  # a folder link leaving it
    (work / "configs" / "loop").symlink_to(work)  # a loop: Ray would pack work/configs/loop/configs/loop/...
    (work / "configs" / "dangling").symlink_to(work / "nowhere")
    (work / "configs" / "same.yaml").symlink_to(work / "configs" / "run.yaml")  # stays inside: uploaded
    return work


def test_links_leaving_the_folder_loops_and_default_excludes_are_not_uploaded(working_dir, tmp_path):
    plan = plan_upload(working_dir, ["*.log"])
    assert sorted(path for path, _ in plan.skipped_links) == ["configs/dangling", "configs/home", "configs/leak", "configs/loop"]
    assert dict(plan.skipped_links)["configs/leak"].startswith("points outside the working directory")
    package = tmp_path / "package.zip"
    create_package(str(working_dir), package, include_gitignore=True, excludes=plan.excludes)  # what Ray uploads
    with zipfile.ZipFile(package) as archive:
        uploaded = sorted(name for name in archive.namelist() if not name.endswith("/"))
        contents = b"".join(archive.read(name) for name in uploaded)
        uploaded_bytes = sum(archive.getinfo(name).file_size for name in uploaded)
    assert uploaded == ["configs/run.yaml", "configs/same.yaml", "fedray/data/loader.py"]
    assert b"secret" not in contents
    assert (plan.files, plan.bytes) == (3, uploaded_bytes)  # the printed upload size is what Ray packs


def test_a_link_to_a_file_the_upload_rules_leave_out_is_not_uploaded(working_dir, tmp_path):
    """Issue 42: ``configs/creds -> ../.env`` stays inside the working directory, but Ray packs a file
    link's target under the link's name, so it shipped ``.env``; likewise a link into ``data/`` or to a
    file a ``.gitignore`` names."""
    (working_dir / ".gitignore").write_text("secrets.txt\n")
    (working_dir / "secrets.txt").write_text("token=secret\n")
    (working_dir / "configs" / "creds").symlink_to(Path("..") / ".env")
    (working_dir / "configs" / "token").symlink_to(working_dir / "secrets.txt")
    (working_dir / "configs" / "dataset.bin").symlink_to(working_dir / "data" / "cifar.bin")
    plan = plan_upload(working_dir)
    reasons = dict(plan.skipped_links)
    assert reasons["configs/creds"] == "points at .env, which the upload rules leave out"
    assert reasons["configs/token"] == "points at secrets.txt, which the upload rules leave out"
    assert reasons["configs/dataset.bin"] == "points at data/cifar.bin, which the upload rules leave out"
    package = tmp_path / "package.zip"
    create_package(str(working_dir), package, include_gitignore=True, excludes=plan.excludes)  # what Ray uploads
    with zipfile.ZipFile(package) as archive:
        uploaded = sorted(name for name in archive.namelist() if not name.endswith("/"))
        contents = b"".join(archive.read(name) for name in uploaded)
    assert uploaded == [".gitignore", "configs/run.yaml", "configs/same.yaml", "fedray/data/loader.py"]
    assert b"AWS_SECRET" not in contents and b"token=secret" not in contents
