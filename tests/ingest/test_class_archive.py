"""The gateway JVM's class-data-sharing archive (ingest/class_archive.py).

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

from streamberg.ingest.class_archive import ARCHIVE_NAME, archive_path, jvm_cache_dir
from streamberg.ingest.loopback import loopback_lib_dir

# Starts the gateway as start_local_gateway does: patched lib folder, then the archive.
GATEWAY = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from streamberg.ingest.class_archive import use_archive
    from streamberg.ingest.loopback import bind_beam_servers_to_loopback
    lib_dir = bind_beam_servers_to_loopback(Path(sys.argv[1]))
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
    lib_dir = loopback_lib_dir(cache)
    assert lib_dir is not None
    assert archive_path(lib_dir).is_file(), (
        f"no class archive in {lib_dir}: `make setup` builds it (python -m streamberg.ingest.class_archive)")
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
    lib_dir = loopback_lib_dir(tmp_path)
    assert lib_dir is not None
    (lib_dir / ARCHIVE_NAME).write_bytes(b"not an archive" * 1000)
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
