"""The wheel the images install (deploy/k8s/Dockerfile.*: built from the checkout, pyproject's
package list the one list) holds every module and runs on its own: built here with the real
build backend, installed into a new virtual environment, and used from outside the checkout
(so nothing is imported from the working tree). The dependencies come from the project's
environment through a path entry, not from the network; the wheel itself is installed
without them (--no-deps), so a module the wheel lacks fails the import."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_the_wheel_installs_alone_and_runs(tmp_path: Path) -> None:
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True, cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("streamberg-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = next(archive.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    assert "License: Apache-2.0" in metadata or "Apache Software License" in metadata
    # Every .py of every package folder of the checkout is in the wheel (one list: pyproject's).
    folders = {"common", "table_meta", "ingest", "compactor", "maintenance", "merge", "monitoring", "supervisor", "governor",
               "cli", "fresh"}
    expected = {f"streamberg/{p.relative_to(ROOT).as_posix()}" for folder in folders
                for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts}
    assert expected - set(names) == set(), sorted(expected - set(names))[:10]

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                               capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr[-2000:]
    # The dependencies: the project environment's site-packages as a plain path entry (its own
    # .pth files, the editable install of the checkout among them, are not read from there).
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    modules = sorted(n[:-3].replace("/", ".").removesuffix(".__init__") for n in names
                     if n.endswith(".py") and n.startswith("streamberg/") and "/bench/" not in n)
    code = ("import importlib, streamberg.common as c; assert 'site-packages' in c.__file__, c.__file__\n"
            f"for m in {modules!r}: importlib.import_module(m)\nprint(len({modules!r}))")
    imported = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=outside)
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert int(imported.stdout.strip()) == len(modules) > 100
    streamberg = venv / "bin" / "streamberg"
    version = subprocess.run([str(streamberg), "--version"], capture_output=True, text=True, cwd=outside)
    assert version.returncode == 0 and version.stdout.strip().startswith("streamberg 0."), version
    config = outside / "demo.yaml"
    config.write_text((ROOT / "examples" / "demo.yaml").read_text())
    checked = subprocess.run([str(streamberg), "check", "--config", str(config)], capture_output=True, text=True,
                             cwd=outside)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    completion = subprocess.run([str(streamberg), "completion", "bash"], capture_output=True, text=True, cwd=outside)
    assert completion.returncode == 0 and "govern" in completion.stdout and "--config" in completion.stdout


def test_the_images_install_the_wheel_and_copy_no_package_by_hand() -> None:
    for name in ("Dockerfile.flink", "Dockerfile.spark"):
        text = (ROOT / "deploy" / "k8s" / name).read_text()
        assert "uv build" in text and "/wheels/streamberg-" in text, name
        assert not [line for line in text.splitlines() if line.startswith("COPY ") and line.split()[1] in
                    ("common", "ingest", "fresh", "cli")], name
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
    assert "plugins/s3-fs-presto" in (ROOT / "deploy" / "k8s" / "Dockerfile.flink").read_text()
