"""The gateway JVM's class-data-sharing archive (ingest/local/class_archive.py).

`make setup` builds the archive; these tests show that a gateway JVM started the way
`streamberg ingest` starts it maps thousands of classes from it (with `-Xshare:on`, which
makes the JVM refuse to start rather than silently load without it), and that a damaged
archive costs nothing but the speed-up.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from streamberg.ingest.local.class_archive import ARCHIVE_NAME, DIGEST_SUFFIX, _digest, archive_path, archive_problem
from streamberg.ingest.local.jvm_lib import jvm_cache_dir, patched_lib_dir

# Starts the gateway as start_local_gateway does: patched lib folder, then the archive.
GATEWAY = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from streamberg.ingest.local.class_archive import use_archive
    from streamberg.ingest.local.jvm_lib import prepare_gateway_jvm
    lib_dir = prepare_gateway_jvm(Path(sys.argv[1]))
    print("archive used" if use_archive(lib_dir) else "no archive", flush=True)
    os.environ["JVM_ARGS"] = (os.environ["JVM_ARGS"] + " " + sys.argv[2]).strip()
    from pyflink.java_gateway import get_gateway
    print(get_gateway().jvm.java.lang.System.getProperty("java.version"), flush=True)
""")


def _start_gateway(cache: Path, jvm_args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", GATEWAY, str(cache), jvm_args],
                          capture_output=True, text=True, timeout=180)


@pytest.mark.flink
def test_the_gateway_jvm_maps_the_archive_make_setup_built(tmp_path: Path) -> None:
    cache = jvm_cache_dir(fallback=tmp_path)
    lib_dir = patched_lib_dir(cache)
    assert archive_path(lib_dir).is_file(), (
        f"no class archive in {lib_dir}: `make setup` builds it (python -m streamberg.ingest.local.class_archive)")
    loaded = tmp_path / "class-load.txt"
    run = _start_gateway(cache, f"-Xshare:on -Xlog:class+load=info:file={loaded}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines()[0] == "archive used"
    lines = loaded.read_text().splitlines()
    shared = sum("source: shared objects file (top)" in line for line in lines)
    # The gateway alone loads ~3,000 classes; with the archive nearly all come from its top layer.
    assert shared > 1000, f"{shared} of {len(lines)} classes from the archive"


@pytest.mark.flink
def test_a_damaged_archive_only_costs_the_speed_up(tmp_path: Path) -> None:
    """Even an archive that passes our checks (its digest recorded) but that the JVM cannot
    use leaves the JVM starting without it."""
    lib_dir = patched_lib_dir(tmp_path)
    archive = lib_dir / ARCHIVE_NAME
    archive.write_bytes(b"not an archive" * 1000)
    archive.with_name(ARCHIVE_NAME + DIGEST_SUFFIX).write_text(_digest(archive))
    run = _start_gateway(tmp_path, "")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines() == ["archive used", run.stdout.splitlines()[1]]
    assert run.stdout.splitlines()[1].startswith("17")


def test_the_cache_folder_is_the_installations_unless_overridden(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMBERG_JVM_CACHE", raising=False)
    assert jvm_cache_dir(fallback=tmp_path) == Path(sys.prefix) / "share" / "streamberg" / "jvm"
    monkeypatch.setenv("STREAMBERG_JVM_CACHE", str(tmp_path / "elsewhere"))
    assert jvm_cache_dir(fallback=tmp_path) == tmp_path / "elsewhere"


def test_only_the_archive_that_was_built_is_mapped(tmp_path: Path) -> None:
    """The archive is code the JVM maps: one without its recorded digest, with another
    digest, writable by others, or on a path PyFlink's JVM_ARGS would split is not used."""
    archive = tmp_path / ARCHIVE_NAME
    digest = archive.with_name(ARCHIVE_NAME + DIGEST_SUFFIX)
    assert archive_problem(archive) == "no archive"
    archive.write_bytes(b"classes" * 100)
    assert "no digest" in (archive_problem(archive) or "")
    digest.write_text(_digest(archive))
    assert archive_problem(archive) is None
    archive.write_bytes(b"classes" * 100 + b"swapped")
    assert "digest differs" in (archive_problem(archive) or "")
    digest.write_text(_digest(archive))
    archive.chmod(0o666)
    assert "only this user" in (archive_problem(archive) or "")
    spaced = tmp_path / "a folder"
    spaced.mkdir()
    (spaced / ARCHIVE_NAME).write_bytes(b"x")
    (spaced / (ARCHIVE_NAME + DIGEST_SUFFIX)).write_text(_digest(spaced / ARCHIVE_NAME))
    assert "whitespace" in (archive_problem(spaced / ARCHIVE_NAME) or "")
