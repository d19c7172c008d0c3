"""Keep a local PyFlink run's servers on loopback: three runtime patches of third-party code.

This module and ingest/local/gateway_auth.py are the only places streamberg patches third-party
code, and only for local runs (`streamberg ingest` without a cluster); ingest/local/jvm_lib.py puts
the patched classes on the gateway JVM's classpath. tests/test_listen_loopback.py fails if
any server of a local run listens off loopback again (e.g. after a PyFlink or Beam upgrade).

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
import struct
from typing import Any

from streamberg.ingest.local.classfile import ClassFile

SERVER_FACTORY_CLASS = "org/apache/beam/sdk/fn/server/ServerFactory$InetSocketAddressServerFactory.class"
GATEWAY_STARTUP_CLASS = "org/apache/flink/client/python/PythonEnvUtils.class"


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


# -- patches 2 and 3: bytecode, put in the gateway JVM's lib folder by ingest/local/jvm_lib.py --------


def patched_server_factory(original: bytes) -> bytes:
    """The class with `NettyServerBuilder.forPort(address.getPort())` turned into
    `NettyServerBuilder.forAddress(address)`; ValueError when the bytecode is not as expected."""
    cf = ClassFile(original)
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
    return cf.bytes((old, new))


def patched_gateway_startup(original: bytes) -> bytes:
    """PythonEnvUtils with `Port port = NetUtils.getAvailablePort(); int p = port.getPort();`
    turned into `Port port = null; int p = 0;` (patch 3); ValueError when not as expected."""
    cf = ClassFile(original)
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
    return cf.bytes((old, new))
