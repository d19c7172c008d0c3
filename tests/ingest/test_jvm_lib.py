"""The gateway JVM's lib folder is checked, not trusted because it exists (ingest/local/jvm_lib.py).

Whatever is in it runs as the operator: a folder another user can write is not used, our
jar must hold exactly the classes this flink-python jar patches to, the links must point at
Flink's own jars, no other jar may sit on the classpath, and nothing is written through a
name someone could have prepared.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from streamberg.ingest.local.jvm_lib import (
    OUR_JAR,
    expected_classes,
    flink_home,
    jvm_cache_dir,
    patched_lib_dir,
    untrusted_reason,
)


def _python_jar() -> Path:
    return sorted((flink_home() / "opt").glob("flink-python*.jar"))[0]


def test_a_folder_other_users_can_write_is_not_trusted(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    assert untrusted_reason(shared) is None
    shared.chmod(0o777)
    assert "writable by other users" in (untrusted_reason(shared) or "")
    shared.chmod(0o1777)  # sticky: fine above our folder, not as our folder
    assert untrusted_reason(shared) is not None
    mine = shared / "mine"
    mine.mkdir(mode=0o755)
    assert untrusted_reason(mine) is None
    shared.chmod(0o777)  # without the sticky bit anyone may swap `mine` for their own folder
    assert "writable by other users" in (untrusted_reason(mine) or "")
    if os.geteuid() == 0:  # root can hand a folder to another user; everyone else cannot
        os.chown(mine, 65534, 65534)
        shared.chmod(0o755)
        assert "belongs to uid 65534" in (untrusted_reason(mine) or "")


def test_an_untrusted_cache_folder_is_passed_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    configured = tmp_path / "cache"
    configured.mkdir(mode=0o777)
    configured.chmod(0o777)
    monkeypatch.setenv("STREAMBERG_JVM_CACHE", str(configured))
    state = tmp_path / "state"
    assert jvm_cache_dir(fallback=state) == state / "jvm"
    (state / "jvm").chmod(0o777)
    private = jvm_cache_dir(fallback=state)  # nothing trusted is left: a fresh private folder
    assert private.parent != state and untrusted_reason(private) is None


def test_an_empty_or_foreign_jar_in_the_lib_folder_is_replaced(tmp_path: Path) -> None:
    folder = patched_lib_dir(tmp_path)
    ours = folder / OUR_JAR
    expected = expected_classes(_python_jar())

    def holds_expected() -> bool:
        with zipfile.ZipFile(ours) as jar:
            return {name: jar.read(name) for name in jar.namelist()} == expected

    # An empty jar used to pass as "already patched" and silently drop every patch.
    with zipfile.ZipFile(ours, "w"):
        pass
    foreign = folder / "aaa-first-on-the-classpath.jar"
    foreign.write_bytes(b"PK\x05\x06" + b"\x00" * 18)
    lib_jar = next(p for p in folder.glob("flink-dist*.jar"))
    lib_jar.unlink()
    lib_jar.symlink_to(foreign)  # a lib name pointing elsewhere
    assert patched_lib_dir(tmp_path) == folder
    assert holds_expected()
    assert not foreign.exists()
    assert os.readlink(lib_jar) == str(flink_home() / "lib" / lib_jar.name)


def test_nothing_is_written_through_a_prepared_name(tmp_path: Path) -> None:
    """Partial files are made with O_EXCL under names nobody can guess, so a link planted
    where an earlier version wrote (`.<jar>.<pid>`) leads nowhere."""
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    cache = tmp_path / "cache"
    folder = patched_lib_dir(cache)
    (folder / OUR_JAR).unlink()
    planted = folder / f".{OUR_JAR}.{os.getpid()}"
    planted.symlink_to(victim)
    patched_lib_dir(cache)
    assert victim.read_text() == "untouched" and os.readlink(planted) == str(victim)
    assert zipfile.is_zipfile(folder / OUR_JAR)
