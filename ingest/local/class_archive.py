"""A class-data-sharing archive for the gateway JVM of local runs: a faster start-up.

A local `streamberg ingest` starts a JVM that loads ~14,000 classes before its writers read
a record (the py4j gateway, then the MiniCluster, the TaskManager and Beam's runner for the
Python operators). Java 17 can keep the parsed and verified classes of one run in an
archive that later JVMs map instead of loading them again (JEP 350, dynamic CDS): the
archive is written when a JVM started with `-XX:ArchiveClassesAtExit` exits, and used with
`-XX:SharedArchiveFile`.

The archive is only valid for the classpath it was made with, so it lives in the same
installation-wide folder as the patched Flink lib jars (ingest/local/loopback.py), not in a run's
state folder: `<venv>/share/streamberg/jvm` (or $STREAMBERG_JVM_CACHE), shared by every
config. `make setup` builds it (`python -m streamberg.ingest.local.class_archive`) by running a
small local job of the ingest's shape (bounded tick source, Python flat_map, Python map,
discarding sink) with no Kafka and no catalog. A JVM that cannot use the archive (another
Java build, a changed classpath, a damaged file) starts without it, as before (`-Xshare:auto`);
nothing depends on it but the start-up time.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

from streamberg.ingest.local.jvm_lib import CACHE_ENV, jvm_cache_dir, prepare_gateway_jvm

# The gateway JVM, sized for what it does in this job: the MiniCluster moves the writers'
# units (file lists and offsets, not records: the data stays in the Python workers) from
# one operator to the next. Measured with `make bench-peers` (docs/performance.md): at 1M
# events its heap stays far below 256 MB; the serial collector keeps no G1 remembered sets
# (~50 MB at this size) and gives the heap back after a full collection; C1 alone
# (TieredStopAtLevel=1) starts the MiniCluster about a second sooner on two cores and
# compiles what the JVM's little per-record work needs. The same flags when the archive is
# built and used (its name carries their digest). JVM_ARGS set by the operator come after
# these, so an -Xmx there wins.
GATEWAY_JVM_OPTIONS = ("-Xms64m", "-Xmx1g", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:MaxMetaspaceSize=256m",
                       "-XX:ReservedCodeCacheSize=64m")
# The archive's name carries the options' digest: other options, another archive.
ARCHIVE_NAME = f"flink-classes-{hashlib.sha256(' '.join(GATEWAY_JVM_OPTIONS).encode()).hexdigest()[:10]}.jsa"
DIGEST_SUFFIX = ".sha256"
# Silence the JVM's CDS warnings (an unusable archive is not an error; the gateway's stderr
# is a pipe nobody reads until it fails, and a full pipe would block the JVM).
QUIET = "-Xlog:cds*=off"


def archive_path(lib_dir: Path) -> Path:
    return lib_dir / ARCHIVE_NAME


def _digest(path: Path) -> str:
    with path.open("rb") as archive:
        return hashlib.file_digest(archive, "sha256").hexdigest()


def archive_problem(archive: Path) -> str | None:
    """Why the archive must not be mapped: absent, not ours alone, not the one we built (its
    digest, recorded beside it when built), or a path PyFlink's JVM_ARGS cannot carry
    (it splits them on whitespace). The lib folder itself was checked by ingest/local/jvm_lib.py."""
    try:
        info = archive.lstat()
    except FileNotFoundError:
        return "no archive"
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        return "the archive is not a file only this user can change"
    if any(ch.isspace() for ch in str(archive)):
        return "the archive's path holds whitespace, which JVM_ARGS cannot carry"
    try:
        recorded = archive.with_name(archive.name + DIGEST_SUFFIX).read_text().strip()
    except OSError:
        return "no digest recorded beside the archive"
    if recorded != _digest(archive):
        return "the archive is not the one built (digest differs)"
    return None


def use_archive(lib_dir: Path) -> bool:
    """Before the gateway JVM starts: map the archive of this lib folder if there is a sound one.
    PyFlink puts $JVM_ARGS first on the gateway's command line; an operator's own JVM_ARGS stay."""
    archive = archive_path(lib_dir)
    problem = archive_problem(archive)
    if problem is not None:
        if problem != "no archive":
            from streamberg.common.log import get_logger

            get_logger("ingest.class_archive").warning("class archive not used; the JVM starts slower",
                                                       path=str(archive), reason=problem)
        return False
    _add_jvm_args(f"-XX:SharedArchiveFile={archive}", QUIET)
    return True


def add_gateway_jvm_options() -> None:
    if not any(a in os.environ.get("JVM_ARGS", "") for a in GATEWAY_JVM_OPTIONS):
        _add_jvm_args(*GATEWAY_JVM_OPTIONS)


def _add_jvm_args(*args: str) -> None:
    os.environ["JVM_ARGS"] = " ".join([*args, os.environ.get("JVM_ARGS", "")]).strip()


def build(cache: Path, force: bool = False) -> Path | None:
    """Run a small local job in a JVM that writes the archive when it exits; return its path
    (None if the Flink lib jars could not be patched, so there is no stable classpath)."""
    lib_dir = prepare_gateway_jvm(cache)
    if lib_dir is None:
        return None
    archive = archive_path(lib_dir)
    if archive_problem(archive) is None and not force:
        return archive
    if any(ch.isspace() for ch in str(lib_dir)):
        raise RuntimeError(f"{lib_dir}: a path with whitespace cannot be given to the JVM (PyFlink splits "
                           f"JVM_ARGS on it); set {CACHE_ENV} to a folder without")
    # The JVM creates the file itself, so the name is one nobody can have prepared: a fresh
    # private folder (O_EXCL by mkdtemp) inside the checked lib folder.
    private = Path(tempfile.mkdtemp(prefix=f".{ARCHIVE_NAME}.", dir=lib_dir))
    partial = private / ARCHIVE_NAME
    try:
        add_gateway_jvm_options()
        _add_jvm_args(f"-XX:ArchiveClassesAtExit={partial}", QUIET)
        _run_warm_up_job()
        _stop_gateway_jvm()
        if not partial.is_file() or partial.stat().st_size == 0:
            raise RuntimeError(f"the JVM wrote no class archive at {partial}")
        digest = private / (ARCHIVE_NAME + DIGEST_SUFFIX)
        digest.write_text(_digest(partial) + "\n")
        # The digest first, then the archive: a run that sees the new archive sees its digest.
        digest.replace(lib_dir / digest.name)
        partial.replace(archive)  # atomic: a run sees the whole archive or none
        for old in lib_dir.glob("flink-classes*.jsa*"):  # archives of other JVM options: never mapped again
            if not old.name.startswith(ARCHIVE_NAME):
                old.unlink(missing_ok=True)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return archive


def _run_warm_up_job() -> None:
    """The ingest's job shape on a bounded source, in Flink's process mode, as a local run."""
    from streamberg.ingest.local.settings import WORKER_MODE_ENV, configuration, local_settings

    os.environ[WORKER_MODE_ENV] = "process"
    from pyflink.common import Types, WatermarkStrategy
    from pyflink.datastream import StreamExecutionEnvironment
    from pyflink.datastream.connectors import Sink
    from pyflink.datastream.connectors.number_seq import NumberSequenceSource
    from pyflink.java_gateway import get_gateway

    conf = configuration({**local_settings(parallelism=2), "python.fn-execution.bundle.size": "1"})
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    ticks = env.from_source(NumberSequenceSource(0, 999), WatermarkStrategy.no_watermarks(), "ticks")
    units = ticks.flat_map(lambda tick: [tick] * 2, output_type=Types.LONG()).set_parallelism(2)
    counts = units.map(lambda unit: unit + 1, output_type=Types.LONG()).set_parallelism(1)
    discard = get_gateway().jvm.org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink()
    counts.sink_to(Sink(discard)).set_parallelism(1)
    env.execute("streamberg class archive warm-up")


def _stop_gateway_jvm(timeout: float = 120.0) -> None:
    """Make the gateway JVM exit (it writes the archive on the way out) and wait for it: it is
    this process's child, started by PyFlink."""
    import logging

    from py4j.protocol import Py4JError
    from pyflink.java_gateway import get_gateway

    # py4j logs a traceback for every call that finds the JVM gone (its own clean-up included):
    # the JVM going away is the point here.
    logging.disable(logging.CRITICAL)
    try:
        get_gateway().jvm.java.lang.System.exit(0)
    except Py4JError:
        pass  # the connection dies with the JVM
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no child left: the JVM has exited
        if pid == 0:
            time.sleep(0.2)
    raise RuntimeError(f"the gateway JVM did not exit within {timeout:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m streamberg.ingest.local.class_archive",
        description="Build the class-data-sharing archive that makes a local `streamberg ingest` "
                    "start faster (make setup runs this; safe to re-run).")
    parser.add_argument("--cache", type=Path, default=None,
                        help=f"folder for the patched Flink jars and the archive (default: ${CACHE_ENV}, "
                             "else <venv>/share/streamberg/jvm)")
    parser.add_argument("--force", action="store_true", help="build again even if an archive exists")
    args = parser.parse_args(argv)
    cache = args.cache or jvm_cache_dir(Path(".streamberg/state"))
    started = time.monotonic()
    archive = build(cache, force=args.force)
    if archive is None:
        print("class archive: not built (the Flink lib jars could not be patched); local runs start without it",
              file=sys.stderr)
        return 0
    print(f"class archive: {archive} ({archive.stat().st_size / 2**20:.0f} MiB, {time.monotonic() - started:.0f} s)",
          flush=True)
    # Skip the interpreter's exit hooks: PyFlink's would talk to the JVM that is gone.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
