"""semel.spark.batches: record batches encoded from Arrow columns with NumPy are the
bytes the record-by-record builder makes (semel.protocol.records.build_batch), for
any mix of nulls, empty and long values, string or binary, sliced arrays and any
subset of rows; and a broker takes them (the sink's Spark tests)."""
from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from semel.protocol import records
from semel.spark import batches


def column(rng: random.Random, n: int, kind, nulls: float) -> list:
    out = []
    for _ in range(n):
        if rng.random() < nulls:
            out.append(None)
            continue
        v = "x" * rng.choice([0, 1, 63, 64, 200, 8191, 8192, 20000])
        out.append(v if kind in (pa.string(), pa.large_string()) else v.encode())
    return out


@pytest.mark.parametrize("seed", range(30))
def test_encoded_batch_is_what_the_record_builder_makes(seed):
    rng = random.Random(seed)
    n = rng.choice([1, 2, 65, 300, 9000])
    kinds = [pa.string(), pa.binary(), pa.large_string(), pa.large_binary()]
    kk, vk = rng.choice(kinds), rng.choice(kinds)
    keys = pa.array(column(rng, n, kk, rng.choice([0, 0.2])), kk)
    values = pa.array(column(rng, n, vk, rng.choice([0, 0.1, 1])), vk)
    cut = rng.randint(0, n - 1)
    keys, values = keys.slice(cut), values.slice(cut)  # an array that starts inside its buffers
    rows = np.array(sorted(rng.sample(range(len(values)), rng.randint(1, len(values)))), dtype=np.int64)
    with_key = rng.random() < 0.8
    fields = dict(producer_id=rng.randint(0, 1 << 40), producer_epoch=rng.randint(0, 32000),
                  base_sequence=rng.randint(0, 1 << 30), timestamp_ms=rng.randint(0, 1 << 42))
    got = batches.encode(batches.BinaryColumn(keys) if with_key else None, batches.BinaryColumn(values), rows,
                         **fields)

    def raw(arr, i):
        v = arr[int(i)].as_py()
        return v.encode() if isinstance(v, str) else v
    want = records.build_batch([(raw(keys, i) if with_key else None, raw(values, i)) for i in rows],
                               transactional=True, **fields)
    assert got == want
    assert [r.value for r in records.iter_records(got)] == [raw(values, i) for i in rows]


def test_sizes_count_null_as_empty():
    col = batches.BinaryColumn(pa.array([b"ab", None, b""]))
    assert col.sizes().tolist() == [2, 0, 0]
    assert col.lengths.tolist() == [2, -1, 0]


@pytest.mark.parametrize("seed", range(20))
def test_validity_and_integer_views_are_what_arrow_converts(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 300)
    cut = rng.randint(0, n - 1)
    vals = pa.array([None if rng.random() < 0.3 else b"x" for _ in range(n)]).slice(cut)
    if vals.null_count:
        assert batches.valid(vals).tolist() == vals.is_valid().to_pylist()
    ints = pa.array([rng.randint(-2**31, 2**31 - 1) for _ in range(n)], rng.choice([pa.int32(), pa.int64()]))
    ints = ints.slice(cut)
    assert batches.ints(ints).tolist() == ints.to_pylist()
    enc = vals.fill_null(b"y").dictionary_encode().indices   # what pick_many reads
    assert batches.ints(enc).tolist() == enc.to_pylist()
