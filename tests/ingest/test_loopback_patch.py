"""The bytecode patch that binds Beam's Java gRPC servers to loopback (ingest/loopback.py).

tests/test_listen_loopback.py shows that it works in a real run. This file checks that it
changes exactly one call and refuses bytecode it does not recognise.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from streamberg.ingest.loopback import SERVER_FACTORY_CLASS, flink_home, loopback_lib_dir, patched_server_factory


def _original() -> bytes:
    jar = sorted((flink_home() / "opt").glob("flink-python*.jar"))[0]
    with zipfile.ZipFile(jar) as archive:
        return archive.read(SERVER_FACTORY_CLASS)


def test_patch_swaps_for_port_for_for_address() -> None:
    original = _original()
    patched = patched_server_factory(original)
    assert b"forAddress" not in original and b"forAddress" in patched
    with pytest.raises(ValueError, match="exactly once"):
        patched_server_factory(patched)  # already patched: the forPort call is gone


def test_unexpected_bytecode_is_refused() -> None:
    original = _original()
    with pytest.raises(ValueError):
        patched_server_factory(original.replace(b"forPort", b"forPorx"))


def test_lib_dir_holds_flinks_jars_and_the_patch(tmp_path: Path) -> None:
    folder = loopback_lib_dir(tmp_path)
    assert folder is not None and (folder / "streamberg-loopback-servers.jar").is_file()
    assert {p.name for p in (flink_home() / "lib").glob("*.jar")} <= {p.name for p in folder.glob("*.jar")}
    assert loopback_lib_dir(tmp_path) == folder  # reused
