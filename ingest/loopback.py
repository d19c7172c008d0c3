"""Keep a local PyFlink run's servers on loopback: three runtime patches of third-party code.

This module is the only place streamberg patches a third-party module, and only for local
runs (`streamberg ingest` without a cluster). tests/test_listen_loopback.py fails if any
server of a local run listens off loopback again (e.g. after a PyFlink or Beam upgrade).

1. **Python side, loopback mode.** In PyFlink's loopback mode (the MiniCluster default
   unless `_python_worker_execution_mode=process`), `StreamExecutionEnvironment` starts
   `BeamFnLoopbackWorkerPoolServicer` in the driver: a gRPC server on which the TaskManager
   asks for Python workers. PyFlink binds it with `add_insecure_port('[::]:0')` (every
   interface) while telling Flink to reach it at `localhost:<port>`, and has no setting for
   the address. `_start_on_localhost` is the same method binding `localhost:0`.

2. **JVM side, both modes.** The TaskManager serves the Python workers over Beam's gRPC
   servers (control, data, state, logging, provisioning, artifacts; several per Python
   operator). Beam's `ServerFactory.InetSocketAddressServerFactory` allocates a *loopback*
   address for them but then builds the server with `NettyServerBuilder.forPort(port)`,
   which binds the wildcard address; neither Flink nor Beam has a setting for it. The class
   (in flink-python's jar) is patched in its bytecode — one call: `forPort(address.getPort())`
   becomes `forAddress(address)`, the same length, so nothing else in the class moves — and
   the patched class is put in a jar that comes before flink-python's on the gateway JVM's
   classpath (PyFlink puts `$FLINK_LIB_DIR/*.jar` first; we point it at a folder holding
   links to Flink's own lib jars plus ours, and set FLINK_HOME, without which PyFlink
   resets FLINK_LIB_DIR). If the bytecode is not the expected one (another
   Beam version), nothing is patched and a warning says the servers listen on every interface.

3. **JVM side, at start.** The gateway JVM's `PythonEnvUtils.startGatewayServer` first asks
   Flink's `NetUtils.getAvailablePort()` for a port number for its py4j callback client.
   That probe is a `new ServerSocket(0)`: a socket listening on every interface, held while a
   lock file is taken (milliseconds, longer on a loaded machine; the listen test caught one
   under CI load). The number is a placeholder: PyFlink resets the callback client to the
   driver's real callback port as soon as the gateway is up (`resetCallbackClient`). The
   patch replaces the probe and its `getPort()` with a null reservation and port 0, same
   length; the class goes in the same jar as patch 2.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import struct
import zipfile
from pathlib import Path
from typing import Any

from streamberg.common.log import get_logger

SERVER_FACTORY_CLASS = "org/apache/beam/sdk/fn/server/ServerFactory$InetSocketAddressServerFactory.class"
GATEWAY_STARTUP_CLASS = "org/apache/flink/client/python/PythonEnvUtils.class"
# Part of the cache folder's name: a folder made by an earlier set of patches is not reused.
PATCH_SET_VERSION = 2


# `self`: PyFlink's BeamFnLoopbackWorkerPoolServicer; this is its `start`, one string changed.
def _start_on_localhost(self: Any) -> str:
    import grpc
    from apache_beam.portability.api import beam_fn_api_pb2_grpc
    from apache_beam.utils import thread_pool_executor

    if not self._worker_address:
        worker_server = grpc.server(thread_pool_executor.shared_unbounded_instance())
        worker_address = f"localhost:{worker_server.add_insecure_port('localhost:0')}"
        beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(self, worker_server)
        worker_server.start()
        self._worker_address = worker_address
        atexit.register(functools.partial(worker_server.stop, 1))
    return self._worker_address


def bind_loopback_worker_pool() -> None:
    """Patch 1: the loopback worker pool (if this process ever starts one) listens on localhost."""
    from pyflink.fn_execution.beam.beam_worker_pool_service import BeamFnLoopbackWorkerPoolServicer

    BeamFnLoopbackWorkerPoolServicer.start = _start_on_localhost


# -- patch 2: Beam's Java gRPC servers ----------------------------------------------------------


class _ClassFile:
    """Just enough of a JVM class file to find and add method references."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.count = struct.unpack(">H", data[8:10])[0]
        self.entries: dict[int, tuple] = {}
        i, n = 10, 1
        while n < self.count:
            tag = data[i]
            if tag == 1:
                length = struct.unpack(">H", data[i + 1:i + 3])[0]
                self.entries[n] = (1, data[i + 3:i + 3 + length].decode("utf-8", "replace"))
                i += 3 + length
            elif tag in (7, 8, 16, 19, 20):
                self.entries[n] = (tag, struct.unpack(">H", data[i + 1:i + 3])[0])
                i += 3
            elif tag == 15:
                i += 4
            elif tag in (3, 4):
                i += 5
            elif tag in (5, 6):  # 8-byte constants take two slots
                i += 9
                n += 1
            elif tag in (9, 10, 11, 12, 17, 18):
                self.entries[n] = (tag, *struct.unpack(">HH", data[i + 1:i + 5]))
                i += 5
            else:
                raise ValueError(f"unknown constant pool tag {tag}")
            n += 1
        self.pool_end = i
        self.added = b""

    def utf8(self, index: int) -> str:
        return self.entries[index][1]

    def method(self, owner: str, name: str, descriptor: str) -> int | None:
        for index, entry in self.entries.items():
            if entry[0] == 10:
                _, cls, nat = entry
                _, n, d = self.entries[nat]
                if self.utf8(self.entries[cls][1]) == owner and self.utf8(n) == name and self.utf8(d) == descriptor:
                    return index
        return None

    def add_method(self, class_index: int, name: str, descriptor: str) -> int:
        def utf8(text: str) -> bytes:
            raw = text.encode()
            return b"\x01" + struct.pack(">H", len(raw)) + raw

        first = self.count  # the next free index: entries are appended at the end of the pool
        name_i, desc_i, nat_i, method_i = first, first + 1, first + 2, first + 3
        self.added += utf8(name) + utf8(descriptor) + b"\x0c" + struct.pack(">HH", name_i, desc_i)
        self.added += b"\x0a" + struct.pack(">HH", class_index, nat_i)
        self.count += 4
        return method_i

    def bytes(self, code_old: bytes, code_new: bytes) -> bytes:
        body = self.data[self.pool_end:]
        if body.count(code_old) != 1:
            raise ValueError("the call to patch is not there exactly once")
        return (self.data[:8] + struct.pack(">H", self.count) + self.data[10:self.pool_end] + self.added
                + body.replace(code_old, code_new))


def patched_server_factory(original: bytes) -> bytes:
    """The class with `NettyServerBuilder.forPort(address.getPort())` turned into
    `NettyServerBuilder.forAddress(address)`; ValueError when the bytecode is not as expected."""
    cf = _ClassFile(original)
    get_port = cf.method("java/net/InetSocketAddress", "getPort", "()I")
    builder = next((cf.utf8(cf.entries[e[1]][1]) for e in cf.entries.values()
                    if e[0] == 10 and cf.utf8(cf.entries[e[2]][1]) == "forPort"), None)
    if get_port is None or builder is None:
        raise ValueError("InetSocketAddress.getPort / NettyServerBuilder.forPort not referenced")
    for_port = cf.method(builder, "forPort", f"(I)L{builder};")
    builder_class = cf.entries[for_port][1] if for_port is not None else None
    if for_port is None or builder_class is None:
        raise ValueError("NettyServerBuilder.forPort(int) not referenced")
    for_address = cf.method(builder, "forAddress", f"(Ljava/net/SocketAddress;)L{builder};") or \
        cf.add_method(builder_class, "forAddress", f"(Ljava/net/SocketAddress;)L{builder};")
    # aload_1; invokevirtual getPort; invokestatic forPort  ->  aload_1; invokestatic forAddress; 3 x nop
    old = b"\x2b\xb6" + struct.pack(">H", get_port) + b"\xb8" + struct.pack(">H", for_port)
    new = b"\x2b\xb8" + struct.pack(">H", for_address) + b"\x00\x00\x00"
    return cf.bytes(old, new)


def patched_gateway_startup(original: bytes) -> bytes:
    """PythonEnvUtils with `Port port = NetUtils.getAvailablePort(); int p = port.getPort();`
    turned into `Port port = null; int p = 0;` (patch 3); ValueError when not as expected."""
    cf = _ClassFile(original)
    get_available = cf.method("org/apache/flink/util/NetUtils", "getAvailablePort",
                              "()Lorg/apache/flink/util/NetUtils$Port;")
    get_port = cf.method("org/apache/flink/util/NetUtils$Port", "getPort", "()I")
    if get_available is None or get_port is None:
        raise ValueError("NetUtils.getAvailablePort / NetUtils$Port.getPort not referenced")
    # invokestatic getAvailablePort; astore_1; aload_1; invokevirtual getPort; istore_2
    #   ->  aconst_null; astore_1; iconst_0; istore_2; 5 x nop
    # try-with-resources closes the Port only when it is not null.
    old = b"\xb8" + struct.pack(">H", get_available) + b"\x4c\x2b\xb6" + struct.pack(">H", get_port) + b"\x3d"
    new = b"\x01\x4c\x03\x3d" + b"\x00" * 5
    return cf.bytes(old, new)


# (class in flink-python's jar, patch, what stays exposed without it)
JVM_PATCHES = (
    (SERVER_FACTORY_CLASS, patched_server_factory, "Beam's gRPC servers will listen on every interface"),
    (GATEWAY_STARTUP_CLASS, patched_gateway_startup,
     "the gateway JVM's start-up port probe will listen on every interface for a moment"),
)


def flink_home() -> Path:
    """The Flink distribution PyFlink runs: $FLINK_HOME, else the pyflink package itself."""
    import pyflink

    return Path(os.environ.get("FLINK_HOME") or Path(pyflink.__file__).parent)


def patched_classes(python_jar: Path) -> dict[str, bytes]:
    """Each JVM patch that applies to this flink-python jar; a warning for each that does not."""
    log = get_logger("ingest.loopback")
    patched = {}
    with zipfile.ZipFile(python_jar) as jar:
        for name, patch, exposed in JVM_PATCHES:
            try:
                patched[name] = patch(jar.read(name))
            except (KeyError, ValueError) as exc:
                log.warning("cannot patch a flink-python class (unexpected jar)", java_class=name,
                            consequence=exposed, reason=str(exc))
    return patched


def loopback_lib_dir(cache: Path) -> Path | None:
    """A folder for FLINK_LIB_DIR: PyFlink's lib jars (links) and a jar of the patched classes.
    None (and a warning) when no patch can be made."""
    home = flink_home()
    python_jars = sorted((home / "opt").glob("flink-python*.jar"))
    if not python_jars:
        get_logger("ingest.loopback").warning(
            "flink-python jar not found; Beam's gRPC servers will listen on every interface")
        return None
    digest = hashlib.sha256(python_jars[0].read_bytes()).hexdigest()[:16]
    folder = cache / f"flink-lib-{digest}-p{PATCH_SET_VERSION}"
    marker = folder / "streamberg-loopback-servers.jar"
    if marker.exists():
        return folder
    patched = patched_classes(python_jars[0])
    if not patched:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    for jar_path in (home / "lib").glob("*.jar"):
        link = folder / jar_path.name
        if not link.exists():
            try:
                link.symlink_to(jar_path)
            except FileExistsError:
                pass  # another run made it meanwhile
    partial = folder / f".{marker.name}.{os.getpid()}"
    with zipfile.ZipFile(partial, "w") as out:
        for name, data in patched.items():
            out.writestr(name, data)
    partial.replace(marker)  # atomic: a concurrent run sees the whole jar or none
    return folder


def bind_beam_servers_to_loopback(cache: Path) -> Path | None:
    """Patches 2 and 3, before the gateway JVM starts; a JVM already running keeps its classes.
    Returns the lib folder the gateway JVM will load (None: Flink's own, unpatched)."""
    from pyflink import java_gateway

    if getattr(java_gateway, "_gateway", None) is not None or "PYFLINK_GATEWAY_PORT" in os.environ:
        get_logger("ingest.loopback").warning(
            "the Flink gateway JVM is already running; Beam's gRPC servers keep listening on every interface")
        return None
    folder = loopback_lib_dir(cache)
    if folder is not None:
        # PyFlink overwrites FLINK_LIB_DIR with its own lib folder unless FLINK_HOME is set
        # (pyflink/find_flink_home.py); FLINK_HOME is what it would have found anyway.
        os.environ["FLINK_HOME"] = str(flink_home())
        os.environ["FLINK_LIB_DIR"] = str(folder)
    return folder
