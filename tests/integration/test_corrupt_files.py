"""Damaged files on disk: random bytes in the middle of a segment, an
index, a checkpoint, the topic catalogue, the producer-id block; the broker either
starts with one clear line naming the file, or starts and serves only what the
checksums vouch for — never a wrong byte, never a crash or a restart loop."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from semel.client import Client
from semel.launch.process import SemelBroker
from semel.protocol import records
from semel.protocol.errors import KafkaError

BATCHES = 60


def _value(i: int) -> bytes:
    return b"value-%d-" % i + b"x" * 150


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A data dir written by a real broker and closed cleanly: topic t (2 partitions),
    60 one-record batches in t-0, a few in t-1."""
    d = tmp_path_factory.mktemp("pristine")
    b = SemelBroker(d / "data", log_path=d / "broker.log")
    b.start()
    with Client(b.bootstrap) as c:
        c.create_topic("t", 2)
        for i in range(BATCHES):
            assert c.produce("t", 0, records.build_batch([(b"k%d" % i, _value(i))]))[0] == KafkaError.NONE
        for i in range(3):
            c.produce("t", 1, records.build_batch([(b"o%d" % i, b"other")]))
        original = c.fetch("t", 0, 0, max_bytes=1 << 22).records
    assert b.stop() == 0
    b.close()
    return d / "data", original


def _copy(pristine, tmp_path):
    src, original = pristine
    dst = tmp_path / "data"
    shutil.copytree(src, dst)
    return dst, original


def _damage(path, at: int | None = None, n: int = 8) -> int:
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if at is None else at
    for i in range(n):
        data[at + i] ^= 0x5A
    path.write_bytes(bytes(data))
    return at


def _read_all(c: Client, topic: str, partition: int) -> tuple[list[tuple[int, bytes]], KafkaError]:
    """(offset, value) of every record served from offset 0, and the error that stopped
    the reading (NONE at the end of the log). Every batch served must be intact."""
    out, offset = [], 0
    while True:
        got = c.fetch(topic, partition, offset, max_bytes=1 << 22)
        if got.error or not got.records:
            return out, got.error
        for pos, hdr in records.iter_batches(got.records):
            assert records.crc_ok(got.records, pos, hdr.size), f"served a damaged batch at {hdr.base_offset}"
            assert hdr.base_offset == offset, f"served offset {hdr.base_offset}, expected {offset}"
            out += [(r.offset, r.value) for r in records.iter_records(got.records, pos)]
            offset = hdr.last_offset + 1


def _start_fails_with_one_line(data_dir, name: str, tmp_path) -> str:
    """`semel broker start` on damaged data: exits non-zero, one line naming the file,
    no traceback — the same on a second try (a supervisor's restart gets the same
    clear answer, not a crash loop of tracebacks)."""
    lines = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-m", "semel", "broker", "start", "--data-dir", str(data_dir),
                              "--port", "0"], capture_output=True, text=True, timeout=120)
        assert out.returncode != 0
        assert "Traceback" not in out.stderr, out.stderr
        err = [line for line in out.stderr.splitlines() if line.startswith("semel")]
        assert len(err) == 1 and name in err[0], out.stderr
        lines.append(err[0])
    assert lines[0] == lines[1]
    return lines[0]


def test_damaged_middle_of_a_segment_is_never_served(pristine, tmp_path, start_broker):
    data_dir, original = _copy(pristine, tmp_path)
    seg = data_dir / "t-0" / "00000000000000000000.log"
    at = _damage(seg)
    b = start_broker(data_dir=data_dir)
    with Client(b.bootstrap) as c:
        served, err = _read_all(c, "t", 0)
        assert err == KafkaError.KAFKA_STORAGE_ERROR        # retriable: the damaged batch is withheld
        # Everything before the damage, exactly as produced; nothing at or after it.
        assert served == [(i, _value(i)) for i in range(len(served))]
        assert 0 < len(served) < BATCHES
        # The batches served are the original bytes up to the batch the damage hit.
        assert original.startswith(c.fetch("t", 0, 0, max_bytes=1 << 22).records)
        assert len(c.fetch("t", 0, 0, max_bytes=1 << 22).records) <= at
        assert len(_read_all(c, "t", 1)[0]) == 3          # other partitions are unharmed
        assert c.produce("t", 1, records.build_batch([(b"k", b"after")]))[0] == KafkaError.NONE
    assert str(seg) in b.log_path.read_text()
    assert b.alive()


def test_damage_in_the_unchecked_tail_is_cut_at_the_first_bad_batch(pristine, tmp_path, start_broker):
    data_dir, _ = _copy(pristine, tmp_path)
    (data_dir / "t-0" / "recovery.checkpoint").unlink()     # as after a crash: the whole log is checked
    _damage(data_dir / "t-0" / "00000000000000000000.log")
    b = start_broker(data_dir=data_dir)
    with Client(b.bootstrap) as c:
        served, err = _read_all(c, "t", 0)
        assert err == KafkaError.NONE
        assert served == [(i, _value(i)) for i in range(len(served))] and 0 < len(served) < BATCHES
        # The log goes on after the cut: new records get the next offsets.
        e, base = c.produce("t", 0, records.build_batch([(b"k", b"new")]))
        assert e == KafkaError.NONE and base == len(served)
    assert "cutting torn/corrupt tail" in b.log_path.read_text()


@pytest.mark.parametrize("name", ["00000000000000000000.index", "00000000000000000000.timeindex",
                                  "recovery.checkpoint"])
def test_damaged_index_or_checkpoint_serves_the_same_bytes(pristine, tmp_path, start_broker, name):
    data_dir, original = _copy(pristine, tmp_path)
    path = data_dir / "t-0" / name
    if path.stat().st_size < 16:
        pytest.fail(f"{name} too small to damage in the middle")
    _damage(path, n=min(8, path.stat().st_size // 4))
    b = start_broker(data_dir=data_dir)
    with Client(b.bootstrap) as c:
        served, err = _read_all(c, "t", 0)
        if err == KafkaError.NONE:
            assert served == [(i, _value(i)) for i in range(BATCHES)]
            assert c.fetch("t", 0, 0, max_bytes=1 << 22).records == original
        else:  # an index pointing into the middle of a batch: withheld, never misread
            assert err == KafkaError.KAFKA_STORAGE_ERROR
            assert served == [(i, _value(i)) for i in range(len(served))]
    assert b.alive()


@pytest.mark.parametrize("name,what", [("topics.catalogue", "checksum mismatch"),
                                       ("producer_ids", "corrupt")])
def test_damaged_catalogue_or_producer_ids_stop_the_start_with_one_line(pristine, tmp_path, name, what):
    data_dir, _ = _copy(pristine, tmp_path)
    path = data_dir / name
    _damage(path, at=max(path.stat().st_size // 2 - 4, 0), n=4)
    line = _start_fails_with_one_line(data_dir, name, tmp_path)
    assert what in line and "cannot start" in line


def test_truncated_producer_ids_stop_the_start_with_one_line(pristine, tmp_path):
    data_dir, _ = _copy(pristine, tmp_path)
    path = data_dir / "producer_ids"
    path.write_bytes(path.read_bytes()[:5])
    line = _start_fails_with_one_line(data_dir, "producer_ids", tmp_path)
    assert "corrupt (5 bytes" in line and "cannot start" in line


def test_damaged_dynamic_broker_configs_stop_the_start_with_one_line(pristine, tmp_path):
    """The settings in a damaged file are not guessed (a retention default read as
    something else would delete data): the start stops, naming the file."""
    from semel.cluster.broker_configs import FILE_HEADER, FILE_NAME
    from semel.storage import checked_file
    data_dir, _ = _copy(pristine, tmp_path)
    path = data_dir / FILE_NAME
    path.write_bytes(checked_file.encode(FILE_HEADER, b'{"<default>": {"log.retention.ms": "86400000"}}'))
    _damage(path, at=path.stat().st_size - 6, n=2)
    line = _start_fails_with_one_line(data_dir, FILE_NAME, tmp_path)
    assert "checksum mismatch" in line and "cannot start" in line
