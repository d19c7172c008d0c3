"""The bytecode patches that keep the gateway JVM's servers on loopback (ingest/loopback.py).

tests/test_listen_loopback.py shows that they work in a real run; the start-up port probe
lasts milliseconds, too short for sampling to be sure to see, so this file also checks that
the JVM runs our class. Each patch changes exactly one call and refuses bytecode it does not
recognise.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from streamberg.ingest.loopback import (
    GATEWAY_STARTUP_CLASS,
    SERVER_FACTORY_CLASS,
    _ClassFile,
    flink_home,
    loopback_lib_dir,
    patched_gateway_startup,
    patched_server_factory,
)


def _original(name: str = SERVER_FACTORY_CLASS) -> bytes:
    jar = sorted((flink_home() / "opt").glob("flink-python*.jar"))[0]
    with zipfile.ZipFile(jar) as archive:
        return archive.read(name)


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


def test_gateway_startup_patch_drops_the_port_probe() -> None:
    original = _original(GATEWAY_STARTUP_CLASS)
    probe = _ClassFile(original).method("org/apache/flink/util/NetUtils", "getAvailablePort",
                                        "()Lorg/apache/flink/util/NetUtils$Port;")
    assert probe is not None
    call = b"\xb8" + struct.pack(">H", probe)  # invokestatic NetUtils.getAvailablePort
    patched = patched_gateway_startup(original)
    assert original.count(call) == 1 and patched.count(call) == 0
    assert len(patched) == len(original)
    with pytest.raises(ValueError, match="exactly once"):
        patched_gateway_startup(patched)
    with pytest.raises(ValueError):
        patched_gateway_startup(original.replace(b"getAvailablePort", b"getAvailablePorx"))


@pytest.mark.flink
def test_the_gateway_jvm_runs_the_patched_classes(tmp_path: Path) -> None:
    """A gateway started as `streamberg ingest` starts it loads both classes from our jar,
    passes the JVM's bytecode verifier, and answers through the callback client it reset."""
    script = textwrap.dedent("""
        import sys
        from pathlib import Path
        from streamberg.ingest.loopback import bind_beam_servers_to_loopback
        bind_beam_servers_to_loopback(Path(sys.argv[1]))
        from pyflink.java_gateway import get_gateway
        jvm = get_gateway().jvm
        for name in sys.argv[2:]:
            print(jvm.java.lang.Class.forName(name).getProtectionDomain().getCodeSource().getLocation().getPath())
    """)
    names = [c.removesuffix(".class").replace("/", ".") for c in (GATEWAY_STARTUP_CLASS, SERVER_FACTORY_CLASS)]
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path / "state"), *names],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    sources = run.stdout.split()
    assert len(sources) == 2 and all(s.endswith("/streamberg-loopback-servers.jar") for s in sources), run.stdout


def test_lib_dir_holds_flinks_jars_and_the_patch(tmp_path: Path) -> None:
    folder = loopback_lib_dir(tmp_path)
    assert folder is not None and (folder / "streamberg-loopback-servers.jar").is_file()
    with zipfile.ZipFile(folder / "streamberg-loopback-servers.jar") as jar:
        assert set(jar.namelist()) == {SERVER_FACTORY_CLASS, GATEWAY_STARTUP_CLASS}
    assert {p.name for p in (flink_home() / "lib").glob("*.jar")} <= {p.name for p in folder.glob("*.jar")}
    assert loopback_lib_dir(tmp_path) == folder  # reused
