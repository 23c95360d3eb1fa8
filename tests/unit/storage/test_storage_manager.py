"""LogManager: the durable topic catalogue and its crash safety."""
from __future__ import annotations

import os

import pytest
from storage_helpers import append, batch, values

from semel.protocol.errors import KafkaError
from semel.storage import FaultyFileSystem, LogConfig, LogManager, StorageError
from semel.storage.manager import CATALOGUE, DELETING, TopicInfo

CFG = LogConfig(segment_bytes=4096, index_interval_bytes=256)


@pytest.fixture
def fs():
    return FaultyFileSystem()


@pytest.fixture
def mgr(tmp_path, fs):
    m = LogManager(tmp_path / "data", CFG, fs)
    yield m
    fs.clear_faults()
    m.close()


def test_create_and_use_topic(mgr, tmp_path):
    assert mgr.create_topic("orders", 3) == KafkaError.NONE
    info = mgr.topics()["orders"]
    assert (info.partitions, info.internal, info.config) == (3, False, {})
    assert len(info.topic_id) == 36
    for p in range(3):
        assert (tmp_path / "data" / f"orders-{p}").is_dir()
        assert mgr.get("orders", p) is not None
    assert mgr.get("orders", 3) is None and mgr.get("nope", 0) is None
    append(mgr.get("orders", 1), batch(b"hello"))
    assert sorted(k for k, _ in mgr.all_logs()) == [("orders", 0), ("orders", 1), ("orders", 2)]


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "bad name", "sl/ash", "ünï", "__internal"])
def test_invalid_names(mgr, name):
    assert mgr.create_topic(name, 1) == KafkaError.INVALID_TOPIC_EXCEPTION
    assert mgr.topics() == {}


def test_name_rules(mgr):
    assert mgr.create_topic("a" * 249, 1) == KafkaError.NONE
    assert mgr.create_topic("Ok.name_with-all-9", 1) == KafkaError.NONE
    assert mgr.create_topic("Ok_name_with-all-9", 1) == KafkaError.INVALID_TOPIC_EXCEPTION  # collides
    assert mgr.create_topic("__consumer_offsets", 2, {"cleanup.policy": "compact"}, internal=True) == KafkaError.NONE
    assert mgr.topics()["__consumer_offsets"].internal
    assert mgr.delete_topic("__consumer_offsets") == KafkaError.INVALID_TOPIC_EXCEPTION


def test_existing_and_partitions_and_config_errors(mgr):
    assert mgr.create_topic("t", 1) == KafkaError.NONE
    assert mgr.create_topic("t", 1) == KafkaError.TOPIC_ALREADY_EXISTS
    assert mgr.create_topic("u", 0) == KafkaError.INVALID_PARTITIONS
    assert mgr.create_topic("u", -3) == KafkaError.INVALID_PARTITIONS
    assert mgr.create_topic("u", 1, {"retention.ms": "soon"}) == KafkaError.INVALID_CONFIG
    assert mgr.create_topic("u", 1, {"no.such.config": "1"}) == KafkaError.INVALID_CONFIG
    assert "no.such.config" in mgr.last_error_message
    assert mgr.create_topic("u", 1, {"segment.bytes": "5"}) == KafkaError.INVALID_CONFIG
    assert list(mgr.topics()) == ["t"]


def test_topic_config_reaches_the_logs(mgr):
    assert mgr.create_topic("t", 2, {"retention.ms": "1000", "segment.bytes": "8192",
                                     "min.insync.replicas": "1"}) == KafkaError.NONE
    plog = mgr.get("t", 1)
    assert (plog.config.retention_ms, plog.config.segment_bytes) == (1000, 8192)
    assert plog.config.index_interval_bytes == CFG.index_interval_bytes
    assert mgr.set_topic_config("t", {"retention.bytes": "100"}) == KafkaError.NONE
    assert (plog.config.retention_bytes, plog.config.retention_ms) == (100, CFG.retention_ms)
    assert mgr.set_topic_config("t", {"retention.bytes": "x"}) == KafkaError.INVALID_CONFIG
    assert mgr.set_topic_config("zz", {}) == KafkaError.UNKNOWN_TOPIC_OR_PARTITION


def test_catalogue_survives_restart(tmp_path, fs):
    m = LogManager(tmp_path / "data", CFG, fs)
    m.create_topic("a", 2, {"retention.ms": "5000"})
    m.create_topic("__transaction_state", 1, internal=True)
    append(m.get("a", 1), batch(b"kept"))
    ids = {n: t.topic_id for n, t in m.topics().items()}
    m.close()
    m = LogManager(tmp_path / "data", CFG, fs)
    assert {n: t.topic_id for n, t in m.topics().items()} == ids
    assert m.topics()["a"].config == {"retention.ms": "5000"}
    assert m.get("a", 1).config.retention_ms == 5000
    assert values(m.get("a", 1)) == [(0, b"kept")]
    m.close()


def test_delete_topic(mgr, tmp_path):
    mgr.create_topic("gone", 2)
    assert mgr.delete_topic("gone") == KafkaError.NONE
    assert "gone" not in mgr.topics() and mgr.get("gone", 0) is None
    assert not (tmp_path / "data" / "gone-0").exists()
    assert mgr.delete_topic("gone") == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    # the name is free again and the new topic starts empty
    assert mgr.create_topic("gone", 1) == KafkaError.NONE
    assert mgr.get("gone", 0).log_end_offset == 0


def test_create_partitions(mgr):
    mgr.create_topic("t", 1)
    assert mgr.create_partitions("t", 1) == KafkaError.INVALID_PARTITIONS
    assert mgr.create_partitions("t", 3) == KafkaError.NONE
    assert mgr.topics()["t"].partitions == 3 and mgr.get("t", 2) is not None
    assert mgr.create_partitions("nope", 3) == KafkaError.UNKNOWN_TOPIC_OR_PARTITION


def test_failed_catalogue_write_leaves_the_old_state(tmp_path, fs):
    m = LogManager(tmp_path / "data", CFG, fs)
    m.create_topic("old", 1)
    fs.fail_next_rename(path_contains=CATALOGUE)
    assert m.create_topic("new", 1) == KafkaError.KAFKA_STORAGE_ERROR
    assert list(m.topics()) == ["old"]
    fs.fail_next_fsync(path_contains=CATALOGUE)
    assert m.delete_topic("old") == KafkaError.KAFKA_STORAGE_ERROR
    assert list(m.topics()) == ["old"] and m.get("old", 0) is not None
    m.close()
    m = LogManager(tmp_path / "data", CFG, fs)
    assert list(m.topics()) == ["old"]
    assert not (tmp_path / "data" / "new-0").exists()
    assert not [n for n in os.listdir(tmp_path / "data") if n.endswith(".tmp")]
    m.close()


def test_crash_after_create_commit_gives_the_new_topic(tmp_path, fs):
    m = LogManager(tmp_path / "data", CFG, fs)
    m.close()
    # a crash right after the catalogue was written, before any directory existed
    m._write_catalogue({"fresh": TopicInfo("fresh", 2, {}, False, "id-1")})
    m = LogManager(tmp_path / "data", CFG, fs)
    assert m.topics()["fresh"].partitions == 2 and m.get("fresh", 1) is not None
    m.close()


def test_interrupted_delete_is_finished_at_start(tmp_path, fs):
    m = LogManager(tmp_path / "data", CFG, fs)
    m.create_topic("doomed", 2)
    m.create_topic("kept", 1)
    append(m.get("doomed", 0), batch(b"x"))
    m.close()
    # a crash after the "deleting" mark, before the directories were removed
    topics = m._load_catalogue()
    topics["doomed"].state = DELETING
    m._write_catalogue(topics)
    m = LogManager(tmp_path / "data", CFG, fs)
    assert list(m.topics()) == ["kept"]
    assert not (tmp_path / "data" / "doomed-0").exists()
    assert "doomed" not in m._load_catalogue()
    m.close()


def test_stray_directories_do_not_leak_into_a_new_topic(tmp_path, fs):
    m = LogManager(tmp_path / "data", CFG, fs)
    m.create_topic("t", 1)
    append(m.get("t", 0), batch(b"old"))
    m.close()
    m._write_catalogue({})          # the topic vanished from the catalogue, its directory stayed
    m = LogManager(tmp_path / "data", CFG, fs)
    assert m.create_topic("t", 1) == KafkaError.NONE
    assert m.get("t", 0).log_end_offset == 0
    m.close()


def test_damaged_catalogue_is_refused(tmp_path, fs):
    m = LogManager(tmp_path / "data", CFG, fs)
    m.create_topic("t", 1)
    m.close()
    path = tmp_path / "data" / CATALOGUE
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0x20
    path.write_bytes(raw)
    with pytest.raises(StorageError, match="checksum"):
        LogManager(tmp_path / "data", CFG, fs)


def test_retention_skips_compacted_topics(mgr):
    mgr.create_topic("del", 1, {"retention.bytes": "1000"})
    mgr.create_topic("__consumer_offsets", 1, {"cleanup.policy": "compact", "retention.bytes": "1000"},
                     internal=True)
    for name in ("del", "__consumer_offsets"):
        for i in range(100):
            append(mgr.get(name, 0), batch(b"r" * 60))
    assert mgr.enforce_retention(now_ms=0) > 0
    assert mgr.get("del", 0).log_start_offset > 0
    assert mgr.get("__consumer_offsets", 0).log_start_offset == 0
