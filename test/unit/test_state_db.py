"""The gateway's state.db as its stores share it (gateway/store.py's Store, common/state_db.py's
StateDB): a transaction commits or rolls back whole, and stores of several tables writing from
many threads at once go through the one lock (no write lost, no transaction opened inside
another)."""
from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import contextmanager

import pytest

from sequence_ai_server.common.volumes import VolumeStore
from sequence_ai_server.gateway.keys import KeyStore
from sequence_ai_server.gateway.store import Store
from sequence_ai_server.ops.quotas import LimitStore
from sequence_ai_server.ops.usage import UsageStore


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


def test_a_transaction_commits_whole_or_rolls_back_whole_and_the_connection_stays_usable(store):
    store.ensure_schema("CREATE TABLE IF NOT EXISTS t (n INTEGER PRIMARY KEY);")
    with store.transaction() as db:
        db.execute("INSERT INTO t (n) VALUES (1)")
        db.execute("INSERT INTO t (n) VALUES (2)")
    with pytest.raises(sqlite3.IntegrityError):
        with store.transaction() as db:
            db.execute("INSERT INTO t (n) VALUES (3)")
            db.execute("INSERT INTO t (n) VALUES (1)")           # the key exists: the 3 goes too
    with pytest.raises(RuntimeError):
        with store.transaction() as db:
            db.execute("INSERT INTO t (n) VALUES (4)")
            raise RuntimeError("the caller changed its mind")
    with store.read() as db:
        assert [r[0] for r in db.execute("SELECT n FROM t ORDER BY n")] == [1, 2]
        assert not db.in_transaction
    with store.transaction() as db:                              # the next one starts cleanly
        db.execute("INSERT INTO t (n) VALUES (5)")
    with store.read() as db:
        assert db.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 3


def test_stores_of_several_tables_writing_from_many_threads_lose_nothing(store):
    keys, usage, limits = KeyStore(store), UsageStore(store), LimitStore(store)
    errors: list = []
    start = threading.Barrier(8)

    def work(i: int) -> None:
        try:
            start.wait()
            for j in range(40):
                usage.add([("echo", "cpu", 3600.0 * 10, {"worker_s": 1.0, "requests": 1})])
                limits.set(f"key:key_{i}", max_workers=j)
                if j % 10 == 0:
                    keys.create(name=f"k{i}-{j}")
                store.update("nothing", served=j)                 # the Store's own writes share the lock
        except Exception as exc:                                  # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    total = usage.totals()["echo"]
    assert total["worker_s"] == {"cpu": 320.0} and total["requests"] == 320
    assert {lim.scope: lim.max_workers for lim in limits.all()} == {f"key:key_{i}": 39 for i in range(8)}
    assert len(KeyStore(store).list()) == 8 * 4


class _Hooked:
    """The gateway's Store with a hook after each read block and each committed transaction, to
    hold a store's thread at the point where a race would bite."""

    def __init__(self, store, after_read=None, after_commit=None):
        self._store, self.after_read, self.after_commit = store, after_read, after_commit

    def ensure_schema(self, script):
        self._store.ensure_schema(script)

    @contextmanager
    def read(self):
        with self._store.read() as db:
            yield db
        if self.after_read:
            self.after_read()

    @contextmanager
    def transaction(self):
        with self._store.transaction() as db:
            yield db
        if self.after_commit:
            self.after_commit()


def test_uploads_to_a_new_volume_at_once_get_versions_of_their_own(store, tmp_path):
    """Every begin reads the versions and inserts the next one in one transaction: eight uploads
    at once, each with its own manifest, whose reads are slowed so that all of them read before
    any inserts, get v1..v8, and two with the same manifest share one version."""
    gate = threading.Barrier(8, timeout=10)
    hooked = _Hooked(store, after_read=lambda: gate.wait() if threading.current_thread().name.startswith("up") else None)
    volumes = VolumeStore(hooked, tmp_path / "volumes", in_use=lambda name: [])
    md5 = "0" * 32
    got, errors = {}, []

    def upload(i):
        try:
            got[i] = volumes.begin("weights", [{"path": f"f{i}.bin", "size": 1, "md5": md5}])["version"]
        except Exception as exc:     # noqa: BLE001 (collected: the test names them)
            errors.append(exc)

    threads = [threading.Thread(target=upload, args=(i,), name=f"up{i}") for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors, errors
    assert sorted(got.values()) == list(range(1, 9))
    again = volumes.begin("weights", [{"path": "f3.bin", "size": 1, "md5": md5}])
    assert (again["version"], again["resumed"]) == (got[3], True)


def test_a_lookup_racing_a_revoke_never_keeps_the_revoked_key_alive(store):
    """A lookup that read the key rows just before a revoke committed must not put those rows
    back into the cache after the revoke dropped it: the next lookup sees the key revoked."""
    in_read, committed = threading.Event(), threading.Event()

    def after_read():
        if threading.current_thread().name == "lookup":
            in_read.set()
            committed.wait(10)          # the revoke commits while this lookup holds its stale rows,
            time.sleep(0.3)             # and is given the time to drop the cache (and refill it)

    hooked = _Hooked(store, after_read=after_read,
                     after_commit=lambda: committed.set() if threading.current_thread().name == "revoke" else None)
    keys = KeyStore(hooked)
    rec, plaintext = keys.create(name="robot")
    lookup = threading.Thread(target=keys.lookup, args=(plaintext,), name="lookup")
    lookup.start()
    assert in_read.wait(10)
    revoke = threading.Thread(target=keys.revoke, args=(rec.id,), name="revoke")
    revoke.start()
    lookup.join(20)
    revoke.join(20)
    assert not lookup.is_alive() and not revoke.is_alive()
    assert keys.lookup(plaintext).revoked_at is not None
