"""The bytecode patches that keep the gateway JVM's servers on loopback (ingest/local/loopback.py).

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

from streamberg.ingest.local.classfile import ClassFile
from streamberg.ingest.local.gateway_auth import (
    AUTHENTICATED_CALLBACK,
    AUTHENTICATED_GATEWAY,
    GatewayAuthError,
    patched_gateway_auth,
)
from streamberg.ingest.local.jvm_lib import OUR_JAR, expected_classes, flink_home, patched_lib_dir
from streamberg.ingest.local.loopback import (
    GATEWAY_STARTUP_CLASS,
    SERVER_FACTORY_CLASS,
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
    probe = ClassFile(original).method("org/apache/flink/util/NetUtils", "getAvailablePort",
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


def test_gateway_auth_patch_builds_through_our_classes() -> None:
    """Two same-length swaps: the builder's build() and the callback client's constructor."""
    original = patched_gateway_startup(_original(GATEWAY_STARTUP_CLASS))
    patched = patched_gateway_auth(original)
    cf = ClassFile(patched)
    assert cf.class_index(AUTHENTICATED_GATEWAY) is not None and cf.class_index(AUTHENTICATED_CALLBACK) is not None
    assert len(patched) - len(original) == cf.pool_end - ClassFile(original).pool_end  # only the constants grew
    with pytest.raises(ValueError):
        patched_gateway_auth(original.replace(b"GatewayServerBuilder", b"GatewayServerBuildex"))


def test_a_flink_python_jar_that_cannot_be_authenticated_stops_the_run(tmp_path: Path) -> None:
    """The loopback patches degrade to a warning; the authentication patch does not."""
    jar = sorted((flink_home() / "opt").glob("flink-python*.jar"))[0]
    doctored = tmp_path / "flink-python-doctored.jar"
    with zipfile.ZipFile(jar) as source, zipfile.ZipFile(doctored, "w") as out:
        for name in (SERVER_FACTORY_CLASS, GATEWAY_STARTUP_CLASS):
            data = source.read(name)
            out.writestr(name, data.replace(b"CallbackClient", b"CallbackClienx") if name == GATEWAY_STARTUP_CLASS
                         else data)
    with pytest.raises(GatewayAuthError, match="cannot authenticate the local Flink gateway"):
        expected_classes(doctored)


@pytest.mark.flink
def test_the_gateway_jvm_runs_the_patched_classes(tmp_path: Path) -> None:
    """A gateway started as `streamberg ingest` starts it loads the patched and the assembled
    classes from our jar, passes the JVM's bytecode verifier, and answers through the
    callback client it reset (a Java sort calling a Python comparator), all with the token."""
    script = textwrap.dedent("""
        import sys
        from pathlib import Path
        from streamberg.ingest.local.jvm_lib import prepare_gateway_jvm
        prepare_gateway_jvm(Path(sys.argv[1]))
        from pyflink.java_gateway import get_gateway
        gateway = get_gateway()
        jvm = gateway.jvm
        for name in sys.argv[2:]:
            print(jvm.java.lang.Class.forName(name).getProtectionDomain().getCodeSource().getLocation().getPath())

        class Descending:
            def compare(self, a, b):
                return b - a

            class Java:
                implements = ["java.util.Comparator"]

        values = jvm.java.util.ArrayList()
        for value in (1, 3, 2):
            values.add(value)
        jvm.java.util.Collections.sort(values, Descending())
        print("callback", list(values))
    """)
    names = [c.removesuffix(".class").replace("/", ".")
             for c in (GATEWAY_STARTUP_CLASS, SERVER_FACTORY_CLASS, AUTHENTICATED_GATEWAY, AUTHENTICATED_CALLBACK)]
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path / "state"), *names],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert len(lines) == 5 and all(s.endswith(f"/{OUR_JAR}") for s in lines[:4]), run.stdout
    assert lines[4] == "callback [3, 2, 1]"


def test_lib_dir_holds_flinks_jars_and_the_patch(tmp_path: Path) -> None:
    folder = patched_lib_dir(tmp_path)
    with zipfile.ZipFile(folder / OUR_JAR) as jar:
        assert set(jar.namelist()) == {SERVER_FACTORY_CLASS, GATEWAY_STARTUP_CLASS,
                                       f"{AUTHENTICATED_GATEWAY}.class", f"{AUTHENTICATED_CALLBACK}.class"}
    assert {p.name for p in (flink_home() / "lib").glob("*.jar")} <= {p.name for p in folder.glob("*.jar")}
    assert patched_lib_dir(tmp_path) == folder  # reused
