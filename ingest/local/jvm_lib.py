"""The gateway JVM's lib folder for local runs: Flink's jars and our patched classes, checked at every start.

PyFlink puts `$FLINK_LIB_DIR/*.jar` first on the gateway JVM's classpath (ahead of
flink-python's jar, which holds the classes we patch). We point it at a folder that links
Flink's own lib jars and holds one jar of ours: the loopback patches (ingest/local/loopback.py)
and the authentication patches and classes (ingest/local/gateway_auth.py). The folder is shared
by every run of the installation (`<venv>/share/streamberg/jvm`, or $STREAMBERG_JVM_CACHE),
beside the class-data-sharing archive (ingest/local/class_archive.py).

Whatever is in that folder runs as the operator, so it is not trusted because it exists:

- the folder and every folder above it must belong to this user or root and must not be
  writable by others (a sticky parent such as /tmp is fine); otherwise the next candidate
  is used, ending in a fresh private folder for this run;
- our jar must hold exactly the classes this flink-python jar patches to (an empty or
  foreign jar is rewritten), each lib link must point at Flink's own jar, and any other jar
  (which would be on the classpath) is removed;
- files are written under names made with O_EXCL and renamed into place.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import stat
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from streamberg.common.log import get_logger
from streamberg.ingest.local.gateway_auth import (
    GatewayAuthError,
    authenticate_pyflink_connection,
    gateway_token,
    helper_classes,
    patched_gateway_auth,
)
from streamberg.ingest.local.loopback import (
    GATEWAY_STARTUP_CLASS,
    SERVER_FACTORY_CLASS,
    patched_gateway_startup,
    patched_server_factory,
)

CACHE_ENV = "STREAMBERG_JVM_CACHE"
OUR_JAR = "streamberg-local-jvm.jar"
# Part of the folder's name: a folder made by an earlier set of patches is not reused.
PATCH_SET_VERSION = 3

# (class in flink-python's jar, patch, what is exposed without it or None when the run must not start)
JVM_PATCHES: tuple[tuple[str, Callable[[bytes], bytes], str | None], ...] = (
    (SERVER_FACTORY_CLASS, patched_server_factory, "Beam's gRPC servers will listen on every interface"),
    (GATEWAY_STARTUP_CLASS, patched_gateway_startup,
     "the gateway JVM's start-up port probe will listen on every interface for a moment"),
    (GATEWAY_STARTUP_CLASS, patched_gateway_auth, None),
)


def untrusted_reason(folder: Path) -> str | None:
    """Why another user could change what is in `folder`; None when only this user or root can."""
    uid = os.geteuid()
    resolved = folder.resolve()
    for path in (resolved, *resolved.parents):
        try:
            info = path.stat()
        except OSError as exc:
            return f"{path}: {exc.strerror}"
        if info.st_uid not in (0, uid):
            return f"{path} belongs to uid {info.st_uid}"
        others_write = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if others_write and (path == resolved or not info.st_mode & stat.S_ISVTX):
            return f"{path} is writable by other users (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _usable(folder: Path) -> str | None:
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o755)
    except OSError as exc:
        return f"{folder}: {exc.strerror}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder} cannot be written"
    return untrusted_reason(folder)


def jvm_cache_dir(fallback: Path) -> Path:
    """The folder for the patched lib folder and the archive: the first trusted of
    $STREAMBERG_JVM_CACHE, `<sys.prefix>/share/streamberg/jvm` and `fallback` (a run's state
    folder: still patched, no archive built there), else a private folder for this run."""
    configured = os.environ.get(CACHE_ENV)
    candidates = [Path(configured)] if configured else [Path(sys.prefix) / "share" / "streamberg" / "jvm"]
    candidates.append(fallback.absolute() / "jvm")
    for folder in candidates:
        reason = _usable(folder)
        if reason is None:
            return folder
        log = get_logger("ingest.jvm_lib")
        (log.warning if folder == candidates[0] and configured else log.debug)(
            "JVM cache folder not used: another user could change it", folder=str(folder), reason=reason)
    private = Path(tempfile.mkdtemp(prefix="streamberg-jvm-"))
    atexit.register(shutil.rmtree, private, True)
    return private


def flink_home() -> Path:
    """The Flink distribution PyFlink runs: $FLINK_HOME, else the pyflink package itself."""
    import pyflink

    return Path(os.environ.get("FLINK_HOME") or Path(pyflink.__file__).parent)


def expected_classes(python_jar: Path) -> dict[str, bytes]:
    """What our jar must hold for this flink-python jar: each patch that applies (a warning
    for each that does not) and the authentication classes. GatewayAuthError when the
    gateway cannot be authenticated."""
    log = get_logger("ingest.jvm_lib")
    patched: dict[str, bytes] = {}
    with zipfile.ZipFile(python_jar) as jar:
        for name, patch, exposed in JVM_PATCHES:
            try:
                patched[name] = patch(patched[name] if name in patched else jar.read(name))
            except (KeyError, ValueError) as exc:
                if exposed is None:
                    raise GatewayAuthError(
                        f"cannot authenticate the local Flink gateway: {name} in {python_jar} is not the "
                        f"expected one ({exc}); streamberg supports the apache-flink version it pins") from exc
                log.warning("cannot patch a flink-python class (unexpected jar)", java_class=name,
                            consequence=exposed, reason=str(exc))
    patched.update(helper_classes())
    return patched


def _jar_holds(path: Path, classes: dict[str, bytes]) -> bool:
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            return False
        with zipfile.ZipFile(path) as jar:
            names = jar.namelist()
            return sorted(names) == sorted(classes) and all(jar.read(n) == classes[n] for n in names)
    except (OSError, zipfile.BadZipFile):
        return False


def _write_jar(folder: Path, classes: dict[str, bytes]) -> None:
    fd, partial = tempfile.mkstemp(prefix=f".{OUR_JAR}.", dir=folder)  # O_EXCL, mode 0600
    with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w") as out:
        for name, data in sorted(classes.items()):
            out.writestr(name, data)
    os.chmod(partial, 0o644)
    os.replace(partial, folder / OUR_JAR)  # atomic: a concurrent run sees the whole jar or none


def _link(folder: Path, name: str, target: Path) -> None:
    partial = folder / f".{name}.{os.getpid()}.{os.urandom(4).hex()}"
    partial.symlink_to(target)  # fails rather than follows when the name exists
    os.replace(partial, folder / name)


def patched_lib_dir(cache: Path) -> Path:
    """The checked (and where needed repaired) lib folder for FLINK_LIB_DIR under `cache`."""
    home = flink_home()
    python_jars = sorted((home / "opt").glob("flink-python*.jar"))
    if not python_jars:
        raise GatewayAuthError(f"the flink-python jar is not in {home / 'opt'}: the local gateway cannot be "
                               "authenticated (reinstall apache-flink with `make setup`)")
    digest = hashlib.sha256(python_jars[0].read_bytes()).hexdigest()[:16]
    folder = cache / f"flink-lib-{digest}-p{PATCH_SET_VERSION}"
    folder.mkdir(parents=True, exist_ok=True, mode=0o755)
    reason = untrusted_reason(folder)
    if reason is not None:
        raise GatewayAuthError(f"the JVM lib folder could be changed by another user: {reason}")
    classes = expected_classes(python_jars[0])
    log = get_logger("ingest.jvm_lib")
    if not _jar_holds(folder / OUR_JAR, classes):
        if (folder / OUR_JAR).exists():
            log.warning("rewrote a JVM patch jar that did not hold the expected classes", path=str(folder / OUR_JAR))
        _write_jar(folder, classes)
    lib_jars = {jar.name: jar for jar in (home / "lib").glob("*.jar")}
    for name, target in lib_jars.items():
        link = folder / name
        if not (link.is_symlink() and os.readlink(link) == str(target)):
            if link.exists() or link.is_symlink():
                log.warning("replaced a lib entry that was not a link to Flink's jar", path=str(link))
            _link(folder, name, target)
    for entry in folder.glob("*.jar"):  # every jar here is on the classpath
        if entry.name != OUR_JAR and entry.name not in lib_jars:
            log.warning("removed a jar that does not belong in the JVM lib folder", path=str(entry))
            entry.unlink()
    return folder


def prepare_gateway_jvm(cache: Path) -> Path | None:
    """Before the gateway JVM starts: the patched lib folder in FLINK_LIB_DIR and the token in
    the environment; PyFlink's connection presents it. Returns the lib folder (None when a
    gateway JVM already runs in this process: it keeps its classes)."""
    from pyflink import java_gateway

    if getattr(java_gateway, "_gateway", None) is not None or "PYFLINK_GATEWAY_PORT" in os.environ:
        get_logger("ingest.jvm_lib").warning("the Flink gateway JVM is already running; it keeps the classes and "
                                             "the authentication it started with")
        return None
    folder = patched_lib_dir(cache)
    # PyFlink overwrites FLINK_LIB_DIR with its own lib folder unless FLINK_HOME is set
    # (pyflink/find_flink_home.py); FLINK_HOME is what it would have found anyway.
    os.environ["FLINK_HOME"] = str(flink_home())
    os.environ["FLINK_LIB_DIR"] = str(folder)
    gateway_token()
    authenticate_pyflink_connection()
    return folder
