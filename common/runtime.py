"""The one owner of a process's shared resources: catalogs (one per catalog config), the state
databases, Kafka consumers kept between reads and Kafka admin clients (with the facts asked
of them), and the Spark session, each opened on first use and closed once, by `close()`.

    with Runtime() as runtime:          # a command's whole life
        catalog = runtime.catalog(config.catalog)
        with runtime.consumer(settings) as consumer:
            ...

A command builds one and everything it calls reaches it through `current()`; code run
outside any (a library call, a test) gets the process's own, made on first use and closed at
exit. Nothing else in the product keeps a resource in a module-level cache (the architecture
test refuses one): a long-lived governor or exporter then holds one catalog per catalog
config, not one per caller, and a test closes everything with one call.

Fork-safe: a child never uses or closes its parent's connections (SQLAlchemy's and
librdkafka's rule for a fork); it opens its own on first use.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import sqlalchemy
    from confluent_kafka import Consumer
    from pyiceberg.catalog import Catalog

    from streamberg.common.config.sections import CatalogConfig

POOL_SIZE = 4  # consumers of one setting kept idle between reads
# A consumer idle longer is closed, not lent: its broker connections may have been dropped
# meanwhile (a broker closes idle ones), and a fetch on a dead connection waits out
# socket.timeout.ms (60 s) before the client notices.
POOL_IDLE_SECONDS = 20.0
TOPIC_ID_SECONDS = 10.0  # a topic's id is asked again after this long (a fact, cheap to keep)
# Consumer settings an admin client refuses or warns about (it is a producer-type handle).
_NOT_ADMIN = ("group.", "enable.", "auto.", "isolation.", "fetch.", "session.", "max.poll", "max.partition.",
              "queued.", "heartbeat.", "partition.assignment", "check.crcs")


def admin_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """A consumer's settings as an admin client takes them: connection and security alone."""
    return {k: v for k, v in settings.items() if not k.startswith(_NOT_ADMIN)}


class Runtime:
    """Catalogs, state engines, consumers and admin clients of one process (see the module's
    notes). Thread-safe; closed once (a closed runtime opens anew if used again)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock  # seconds, monotonic: the ages of pooled consumers and topic ids (a test's own)
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._catalogs: dict[str, Catalog] = {}
        self._engines: dict[str, sqlalchemy.engine.Engine] = {}
        self._consumers: dict[str, list[tuple[float, Consumer]]] = {}  # settings -> (given back at, consumer)
        self._admins: dict[str, Any] = {}
        self._topic_ids: dict[tuple[str, str], tuple[float, str]] = {}
        self._asking: set[tuple[str, str]] = set()  # topic ids being asked in the background
        self._closers: list[Callable[[], None]] = []
        self._spark: Any = None  # the process's Spark session, made on first use (common/spark.py)
        self._previous: Runtime | None = None
        self.opened = {"catalogs": 0, "engines": 0, "consumers": 0, "admins": 0, "spark": 0}  # for tests and status

    # -- catalogs and the state database -----------------------------------------------------------
    def catalog(self, config: CatalogConfig) -> Catalog:
        """The catalog of `config`, opened once in this runtime: a job writing a hundred tables
        opens each several times (its lane, its committer, the dead-letter table), and each
        opening made a new engine (a SQL catalog: a pool, its tables checked, ~4 ms)."""
        key = config.model_dump_json()
        with self._lock:
            self._after_fork()
            found = self._catalogs.get(key)
            if found is None:
                # Its kind's own opening; imported here, on the first catalog: every command
                # imports the runtime, and the catalogs' clients cost ~0.8 s to import.
                from streamberg.common.catalog_kinds import kind_of

                found = self._catalogs[key] = kind_of(config).open(config)
                self.opened["catalogs"] += 1
            return found

    def engine(self, uri: str, make: Callable[[], sqlalchemy.engine.Engine]) -> sqlalchemy.engine.Engine:
        """The state database at `uri` (one engine a URI), made by `make` the first time."""
        with self._lock:
            self._after_fork()
            found = self._engines.get(uri)
            if found is None:
                found = self._engines[uri] = make()
                self.opened["engines"] += 1
            return found

    # -- Kafka -----------------------------------------------------------------------------------------
    @contextmanager
    def consumer(self, settings: dict[str, Any], fresh: bool = False) -> Iterator[Consumer]:
        """A consumer of these settings for one read: a kept one when there is one idle less
        than POOL_IDLE_SECONDS (its broker connections and the topic's metadata cost more than a
        small read), else (or `fresh`) a new one; given back unassigned (its paused partitions
        resumed); one that failed is closed, not kept. Consumers never join a group and never
        commit."""
        from confluent_kafka import Consumer

        key = repr(sorted(settings.items()))
        stale: list[Consumer] = []
        consumer = None
        with self._lock:
            self._after_fork()
            pool = self._consumers.setdefault(key, [])
            now = self._clock()
            stale = [c for at, c in pool if now - at > POOL_IDLE_SECONDS]
            pool[:] = [(at, c) for at, c in pool if now - at <= POOL_IDLE_SECONDS]
            if pool and not fresh:
                consumer = pool.pop()[1]
        for old in stale:
            _close_quietly(old)
        if consumer is None:
            consumer = Consumer(settings)
            with self._lock:
                self.opened["consumers"] += 1
        healthy = False
        try:
            yield consumer
            healthy = True
        finally:
            kept = False
            if healthy:
                try:
                    assigned = consumer.assignment()
                    if assigned:
                        consumer.resume(assigned)
                    consumer.unassign()
                    with self._lock:
                        pool = self._consumers.setdefault(key, [])
                        if len(pool) < POOL_SIZE:
                            pool.append((self._clock(), consumer))
                            kept = True
                except Exception:  # noqa: BLE001 - a consumer in doubt is closed, not kept
                    kept = False
            if not kept:
                consumer.close()

    def admin(self, settings: dict[str, Any]) -> Any:
        """The admin client of these (connection) settings, one for the runtime's life."""
        from confluent_kafka.admin import AdminClient

        wanted = admin_settings(settings)
        key = repr(sorted(wanted.items()))
        with self._lock:
            self._after_fork()
            found = self._admins.get(key)
            if found is None:
                found = self._admins[key] = AdminClient(wanted)
                self.opened["admins"] += 1
            return found

    def topic_id(self, settings: dict[str, Any], topic: str, timeout: float = 5.0) -> str:
        """The topic's id as the broker gives it ("" where it gives none or cannot be asked: then
        the topic's name alone stands for it). Once TOPIC_ID_SECONDS old the id is asked again
        in the background and the one held answers meanwhile (a read to the kept tail's end
        never waits on the broker for a fact it holds: that wait was one read in twenty);
        past twice that, or never asked, it is asked before answering. A topic deleted and
        made again is so seen within 2 x TOPIC_ID_SECONDS."""
        key = (str(settings.get("bootstrap.servers")), topic)
        with self._lock:
            asked_at, found = self._topic_ids.get(key, (float("-inf"), ""))
            age = self._clock() - asked_at
            if age < TOPIC_ID_SECONDS:
                return found
            if age < 2 * TOPIC_ID_SECONDS:
                if key not in self._asking:
                    self._asking.add(key)
                    threading.Thread(target=self._ask_topic_id, args=(settings, topic, timeout), daemon=True,
                                     name="topic-id").start()
                return found
        return self._ask_topic_id(settings, topic, timeout)

    def _ask_topic_id(self, settings: dict[str, Any], topic: str, timeout: float) -> str:
        from confluent_kafka import TopicCollection

        key = (str(settings.get("bootstrap.servers")), topic)
        try:
            described = self.admin(settings).describe_topics(TopicCollection([topic]), request_timeout=timeout)
            answer = described[topic].result(timeout)
            found = str(answer.topic_id) if answer.topic_id is not None else ""
        except Exception:  # noqa: BLE001 - no id: the name stands alone (never a reason to fail)
            found = ""
        with self._lock:
            self._topic_ids[key] = (self._clock(), found)
            self._asking.discard(key)
        return found

    # -- Spark ------------------------------------------------------------------------------------------
    def spark(self, make: Callable[[], Any]) -> Any:
        """The process's Spark session, made by `make` on first use (or again when the one kept
        has stopped: its JVM gone with a signal to the process group), stopped with the runtime.
        One: a JVM holds one SparkContext, and every component of the process runs on it."""
        with self._lock:
            self._after_fork()
            if self._spark is None or not _spark_alive(self._spark):
                self._spark = make()
                self.opened["spark"] += 1
            return self._spark

    # -- life --------------------------------------------------------------------------------------------
    def on_close(self, closer: Callable[[], None]) -> None:
        """Something else this runtime's owner opened closed with it."""
        with self._lock:
            self._closers.append(closer)

    def close(self) -> None:
        """Close every resource, once; the runtime stays usable (the next use opens anew)."""
        from streamberg.common.catalog_open import close_catalog  # (imported on use, as above)

        with self._lock:
            catalogs, self._catalogs = list(self._catalogs.values()), {}
            engines, self._engines = list(self._engines.values()), {}
            consumers = [c for pool in self._consumers.values() for _, c in pool]
            self._consumers = {}
            self._admins, self._topic_ids = {}, {}  # an admin client closes when its handle goes
            closers, self._closers = self._closers, []
            spark, self._spark = self._spark, None
        if spark is not None:
            _stop_spark(spark)
        for catalog in catalogs:
            close_catalog(catalog)
        for engine in engines:
            engine.dispose()
        for consumer in consumers:
            _close_quietly(consumer)
        for closer in reversed(closers):
            try:
                closer()
            except Exception:  # noqa: BLE001 - one failed close never keeps the others open
                pass

    def held(self) -> dict[str, int]:
        """What it holds now: catalogs, engines, idle consumers, admin clients."""
        with self._lock:
            return {"catalogs": len(self._catalogs), "engines": len(self._engines),
                    "consumers": sum(len(p) for p in self._consumers.values()), "admins": len(self._admins),
                    "spark": int(self._spark is not None)}

    def _after_fork(self) -> None:
        """In a forked child: forget the parent's handles without closing them (the parent
        still uses them); the child opens its own."""
        if os.getpid() == self._pid:
            return
        for engine in self._engines.values():
            engine.dispose(close=False)
        self._pid = os.getpid()
        self._catalogs, self._engines, self._consumers, self._admins = {}, {}, {}, {}
        self._topic_ids, self._closers, self._spark = {}, [], None  # the JVM's gateway is the parent's

    def __enter__(self) -> Runtime:
        global _current
        with _install_lock:
            self._previous, _current = _current, self
        return self

    def __exit__(self, *_: object) -> None:
        global _current
        with _install_lock:
            if _current is self:
                _current = self._previous
        self.close()


def _spark_alive(spark: Any) -> bool:
    try:
        return not spark.sparkContext._jsc.sc().isStopped()
    except Exception:  # noqa: BLE001 - the gateway is gone with its JVM
        return False


def _stop_spark(spark: Any) -> None:
    """Stop the session; one already gone (its JVM signalled with the process group) is logged."""
    try:
        spark.stop()
    except Exception as exc:  # noqa: BLE001 - closing what is gone
        from streamberg.common.log import get_logger

        get_logger("spark").warning("Spark had already stopped",
                                    error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def _close_quietly(consumer: Any) -> None:
    try:
        consumer.close()
    except Exception:  # noqa: BLE001 - closing what is closed
        pass


_install_lock = threading.Lock()
_current: Runtime | None = None  # the runtime of the command running, or the process's own


def current() -> Runtime:
    """The runtime of the running command (entered with `with Runtime()`), else the process's
    own (made on first use, closed at exit)."""
    global _current
    with _install_lock:
        if _current is None:
            _current = Runtime()
            import atexit

            atexit.register(_current.close)
        return _current


def _after_fork_in_child() -> None:
    """A thread of the parent may have held a lock at the fork: the child's are new."""
    global _install_lock
    _install_lock = threading.Lock()
    if _current is not None:
        _current._lock = threading.RLock()


os.register_at_fork(after_in_child=_after_fork_in_child)
