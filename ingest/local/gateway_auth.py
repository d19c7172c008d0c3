"""Authenticate the local run's JVM: py4j's gateway and callback, and Flink's REST and RPC ports.

Loopback keeps the network out, not the other users of the host (docs/security.md). Every
port of a local ingest's JVM answered any local process: the py4j gateway runs any Java
method it is asked to (code execution as the operator), and the MiniCluster's REST endpoint
accepts `POST /jobs`. This module closes both.

**py4j, both directions.** PyFlink builds the gateway in Flink's
`PythonEnvUtils.startGatewayServer` with no auth token and has no setting for one; py4j
supports a token on both sides. Two same-length bytecode swaps in that method (the class
already patched by ingest/local/loopback.py) call two small classes assembled here:

- `GatewayServerBuilder.build()` becomes `AuthenticatedGateway.build(builder)`, which sets
  `authToken(<token>)` first: every call into the JVM must present the token;
- `new CallbackClient(port)` becomes `new AuthenticatedCallbackClient(port)`, a subclass
  that passes the token to py4j's `CallbackClient(port, address, token)`: the JVM presents
  it when it calls back into the driver, whose callback server then requires it. PyFlink's
  `resetCallbackClient` copies the client with its token.

The token is 256 random bits made per driver process. It reaches the JVM in its environment
(`/proc/<pid>/environ` is readable by its own user only, unlike the command line), and
PyFlink's connection in the driver through py4j's own `auth_token` parameters.

**Flink's REST, RPC and BLOB ports.** The MiniCluster's REST endpoint has no setting that
removes `POST /jobs`; its RPC (Pekko) and BLOB server take Java-serialized messages. Flink's
own mutual TLS closes them: `security.ssl.rest.*` with `authentication-enabled` and
`security.ssl.internal.*`, with a key pair made per run by the JRE's `keytool` in a private
folder that is removed when the driver exits. A client without that key gets no answer.

What stays open to local users is said in docs/security.md: Beam's gRPC servers between the
TaskManager and the Python workers (no authentication in Beam's portability framework).
"""

from __future__ import annotations

import atexit
import functools
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from streamberg.common.errors import StreambergError
from streamberg.ingest.local.classfile import (
    ALOAD_0,
    ARETURN,
    ILOAD_1,
    RETURN,
    ClassFile,
    Pool,
    assemble,
    invoke,
    ldc,
)

TOKEN_ENV = "STREAMBERG_GATEWAY_TOKEN"
PY4J = "org/apache/flink/api/python/shaded/py4j"
BUILDER = f"{PY4J}/GatewayServer$GatewayServerBuilder"
GATEWAY_SERVER = f"{PY4J}/GatewayServer"
CALLBACK_CLIENT = f"{PY4J}/CallbackClient"
AUTHENTICATED_GATEWAY = "streamberg/flink/AuthenticatedGateway"
AUTHENTICATED_CALLBACK = "streamberg/flink/AuthenticatedCallbackClient"


class GatewayAuthError(StreambergError):
    """The local JVM cannot be authenticated (an unexpected flink-python jar, no keytool)."""


def helper_classes() -> dict[str, bytes]:
    """The two classes the patched start-up calls, by their path in a jar."""
    gateway = Pool()
    build_code = (ALOAD_0 + ldc(gateway.string(TOKEN_ENV))
                  + invoke("static", gateway.methodref("java/lang/System", "getenv",
                                                       "(Ljava/lang/String;)Ljava/lang/String;"))
                  + invoke("virtual", gateway.methodref(BUILDER, "authToken", f"(Ljava/lang/String;)L{BUILDER};"))
                  + invoke("virtual", gateway.methodref(BUILDER, "build", f"()L{GATEWAY_SERVER};"))
                  + ARETURN)
    gateway_class = assemble(AUTHENTICATED_GATEWAY, "java/lang/Object", gateway, [
        (0x0009, "build", f"(L{BUILDER};)L{GATEWAY_SERVER};", 2, 1, build_code)])  # public static

    callback = Pool()
    init_code = (ALOAD_0 + ILOAD_1
                 + invoke("static", callback.methodref("java/net/InetAddress", "getLoopbackAddress",
                                                       "()Ljava/net/InetAddress;"))
                 + ldc(callback.string(TOKEN_ENV))
                 + invoke("static", callback.methodref("java/lang/System", "getenv",
                                                      "(Ljava/lang/String;)Ljava/lang/String;"))
                 + invoke("special", callback.methodref(CALLBACK_CLIENT, "<init>",
                                                        "(ILjava/net/InetAddress;Ljava/lang/String;)V"))
                 + RETURN)
    callback_class = assemble(AUTHENTICATED_CALLBACK, CALLBACK_CLIENT, callback, [
        (0x0001, "<init>", "(I)V", 4, 2, init_code)])  # public
    return {f"{AUTHENTICATED_GATEWAY}.class": gateway_class, f"{AUTHENTICATED_CALLBACK}.class": callback_class}


def patched_gateway_auth(original: bytes) -> bytes:
    """PythonEnvUtils with the gateway built through AuthenticatedGateway and its callback
    client an AuthenticatedCallbackClient; ValueError when the bytecode is not as expected."""
    cf = ClassFile(original)
    build = cf.method(BUILDER, "build", f"()L{GATEWAY_SERVER};")
    callback_class = cf.class_index(CALLBACK_CLIENT)
    callback_init = cf.method(CALLBACK_CLIENT, "<init>", "(I)V")
    if build is None or callback_class is None or callback_init is None:
        raise ValueError("GatewayServerBuilder.build / new CallbackClient(int) not referenced")
    auth_build = cf.add_method(cf.add_class(AUTHENTICATED_GATEWAY), "build",
                               f"(L{BUILDER};)L{GATEWAY_SERVER};")
    auth_callback_class = cf.add_class(AUTHENTICATED_CALLBACK)
    auth_callback_init = cf.add_method(auth_callback_class, "<init>", "(I)V")
    new = b"\xbb"  # new <class>; dup; iload_2 (the port); invokespecial <init>(I)V
    return cf.bytes(
        (invoke("virtual", build), invoke("static", auth_build)),
        (new + callback_class.to_bytes(2, "big") + b"\x59\x1c" + invoke("special", callback_init),
         new + auth_callback_class.to_bytes(2, "big") + b"\x59\x1c" + invoke("special", auth_callback_init)),
    )


@functools.cache
def gateway_token() -> str:
    """This driver's token, in the environment the gateway JVM will inherit."""
    token = secrets.token_hex(32)
    os.environ[TOKEN_ENV] = token
    return token


def authenticate_pyflink_connection() -> None:
    """PyFlink's connection to the gateway and its callback server present and require the token."""
    from py4j.java_gateway import CallbackServerParameters, GatewayParameters
    from pyflink import java_gateway

    token = gateway_token()
    java_gateway.GatewayParameters = functools.partial(GatewayParameters, auth_token=token)  # type: ignore[misc]
    java_gateway.CallbackServerParameters = functools.partial(  # type: ignore[misc]
        CallbackServerParameters, auth_token=token)


# -- Flink's REST, RPC and BLOB ports: mutual TLS ---------------------------------------------


def _keytool() -> str:
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home, "bin", "keytool") if java_home else None
    found = str(candidate) if candidate is not None and candidate.is_file() else shutil.which("keytool")
    if found is None:
        raise GatewayAuthError("keytool not found (it ships with every Java runtime: check JAVA_HOME or PATH); "
                               "without it the local Flink ports cannot be authenticated")
    return found


class RunKeyPair:
    """A self-signed key pair for one driver process, made in the background by keytool.

    Its folder is private (0700) and removed when the driver exits. The password is
    random and travels through keytool's environment and Flink's configuration (set over
    the authenticated gateway), never a command line.
    """

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="streamberg-tls-"))
        atexit.register(shutil.rmtree, self.folder, True)
        self.keystore = self.folder / "run.p12"
        self.password = secrets.token_hex(24)
        env = {**os.environ, "STREAMBERG_KEYSTORE_PASSWORD": self.password}
        self._process = subprocess.Popen(
            [_keytool(), "-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC",  # a short-lived JVM
             "-genkeypair", "-alias", "streamberg-local", "-keyalg", "EC", "-groupname", "secp256r1",
             "-dname", "CN=streamberg-local", "-validity", "30", "-storetype", "PKCS12",
             "-keystore", str(self.keystore), "-storepass:env", "STREAMBERG_KEYSTORE_PASSWORD",
             "-keypass:env", "STREAMBERG_KEYSTORE_PASSWORD"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def wait(self, timeout: float = 120.0) -> Path:
        try:
            output, _ = self._process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            self._process.kill()
            raise GatewayAuthError(f"keytool did not make the run's key pair within {timeout:.0f} s") from exc
        if self._process.returncode != 0 or not self.keystore.is_file():
            text = output.decode("utf-8", "replace").strip()[-500:]
            raise GatewayAuthError(f"keytool could not make the run's key pair (exit {self._process.returncode}): "
                                   f"{text}")
        return self.keystore

    def flink_settings(self) -> dict[str, str]:
        """Mutual TLS on the REST endpoint and between Flink's own components (RPC, BLOB, data)."""
        keystore = str(self.wait())
        settings = {"security.ssl.rest.enabled": "true", "security.ssl.rest.authentication-enabled": "true",
                    "security.ssl.internal.enabled": "true",
                    # Flink's default suite needs an RSA key; ours is EC.
                    "security.ssl.algorithms": "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,"
                                               "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
                    # The peer is authenticated by the one certificate the trust store holds,
                    # not by a host name (it is always this host).
                    "security.ssl.verify-hostname": "false"}
        for scope in ("rest", "internal"):
            settings.update({
                f"security.ssl.{scope}.keystore": keystore,
                f"security.ssl.{scope}.truststore": keystore,
                f"security.ssl.{scope}.keystore-type": "PKCS12",
                f"security.ssl.{scope}.truststore-type": "PKCS12",
                f"security.ssl.{scope}.keystore-password": self.password,
                f"security.ssl.{scope}.key-password": self.password,
                f"security.ssl.{scope}.truststore-password": self.password,
            })
        return settings


_key_pair: RunKeyPair | None = None


def start_run_key_pair() -> RunKeyPair:
    """The driver's key pair, started once (keytool runs while the gateway JVM starts)."""
    global _key_pair
    if _key_pair is None:
        _key_pair = RunKeyPair()
    return _key_pair
