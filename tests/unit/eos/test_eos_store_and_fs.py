"""Unit tests: transactional store backings and the filesystem sink."""
from __future__ import annotations

import os

import pytest

from semel.eos import OK, Fatal, IdempotencyTokens, SqliteBacking, TransactionalStore
from semel.eos.sinks.filesystem import FileSystemSink


# ---------------------------------------------------------------- store

@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_store_buffers_until_commit_and_drops_on_abort(kind, tmp_path):
    store = TransactionalStore(SqliteBacking(tmp_path / "s.db") if kind == "sqlite" else None)
    store.put("a", 1)
    store.put("b", {"x": [1, 2]})
    assert store.get("a") == 1 and "b" in store
    assert store.items() == {}                      # nothing committed yet
    assert store.prepare("t-0-1") is OK
    assert store.recover() == ["t-0-1"]
    assert store.commit("t-0-1") is OK and store.commit("t-0-1") is OK
    assert store.items() == {"a": 1, "b": {"x": [1, 2]}}
    store.delete("a")
    store.put("c", 3)
    assert store.get("a") is None and "a" not in store
    assert store.prepare("t-0-2") is OK and store.abort("t-0-2") is OK
    assert store.items() == {"a": 1, "b": {"x": [1, 2]}} and store.recover() == []
    store.delete("a")
    store.prepare("t-0-3")
    store.commit("t-0-3")
    assert store.items() == {"b": {"x": [1, 2]}}


def test_sqlite_store_pending_survives_reopen_and_is_recovered(tmp_path):
    path = tmp_path / "s.db"
    store = TransactionalStore(SqliteBacking(path))
    store.put("k", "v")
    store.prepare("t-0-4")
    store.close()
    again = TransactionalStore(SqliteBacking(path))   # "restart"
    assert again.recover() == ["t-0-4"] and again.get("k") is None
    again.commit("t-0-4")
    assert again.items() == {"k": "v"} and again.recover() == []


def test_sqlite_store_rejects_values_it_cannot_persist_at_write_time(tmp_path):
    store = TransactionalStore(SqliteBacking(tmp_path / "s.db"))
    with pytest.raises(TypeError):
        store.put("k", object())
    with pytest.raises(TypeError):
        store.put(1, "v")


def test_idempotency_tokens_skip_a_replayed_effect_only_after_commit():
    store = TransactionalStore()
    tokens = IdempotencyTokens(store)
    fired = []
    assert tokens.once("in/0/5", lambda: fired.append(5)) is True
    assert tokens.once("in/0/5", lambda: fired.append(5)) is False   # same cycle: seen in the buffer
    store.abort("t-0-1")                                               # cycle aborted: token dropped
    assert tokens.once("in/0/5", lambda: fired.append(5)) is True     # replay fires again
    store.prepare("t-0-2")
    store.commit("t-0-2")
    assert tokens.once("in/0/5", lambda: fired.append(5)) is False    # committed: never again
    assert fired == [5, 5]


# ---------------------------------------------------------------- filesystem sink

def test_filesystem_sink_prepare_commit_abort_and_idempotence(tmp_path):
    s = FileSystemSink(tmp_path)
    s.stage({"v": 1})
    assert s.prepare("a-0-1", [{"v": 2}]) is OK
    assert (tmp_path / "prepared" / "a-0-1.batch").read_text() == '{"v":1}\n{"v":2}\n'
    assert s.committed_batches() == {}
    assert s.prepare("a-0-1") is OK
    assert s.recover() == ["a-0-1"]
    assert s.commit("a-0-1") is OK and s.commit("a-0-1") is OK
    assert s.committed_batches() == {"a-0-1": [{"v": 1}, {"v": 2}]}
    assert s.recover() == [] and not (tmp_path / "prepared" / "a-0-1.batch").exists()
    assert isinstance(s.abort("a-0-1"), Fatal)
    assert isinstance(s.commit("a-0-9"), Fatal)
    s.stage("x")
    assert s.prepare("a-0-2") is OK and s.abort("a-0-2") is OK and s.abort("a-0-2") is OK
    assert s.recover() == [] and list(s.committed_batches()) == ["a-0-1"]


def test_filesystem_sink_fsyncs_file_and_directories(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd)))
    s = FileSystemSink(tmp_path)
    s.prepare("a-0-1", [1])
    assert synced[0].endswith(".a-0-1.batch.tmp") and synced[1] == str(tmp_path / "prepared")
    synced.clear()
    s.commit("a-0-1")
    assert set(synced) == {str(tmp_path / "prepared"), str(tmp_path / "committed")}


def test_filesystem_sink_cleans_torn_prepares_and_rejects_bad_input(tmp_path):
    s = FileSystemSink(tmp_path)
    (tmp_path / "prepared" / ".a-0-3.batch.tmp").write_text('{"half')
    assert s.recover() == []
    assert not (tmp_path / "prepared" / ".a-0-3.batch.tmp").exists()
    with pytest.raises(TypeError, match="JSON"):
        s.stage(object())
    with pytest.raises(ValueError):
        s.prepare("../evil", [])
    assert s.staged == []
