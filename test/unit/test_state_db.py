"""The gateway's state.db as its stores share it (gateway/store.py's Store, common/state_db.py's
StateDB): a transaction commits or rolls back whole, and stores of several tables writing from
many threads at once go through the one lock (no write lost, no transaction opened inside
another)."""
from __future__ import annotations

import sqlite3
import threading

import pytest

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
