"""S3 two-phase-commit sink (boto3).

    prepare  PUT   {prefix}__pending__/{txn}/batch.jsonl
    commit   COPY  that object to {prefix}{data_dir}{txn}.jsonl, then DELETE the pending prefix
    abort    DELETE everything under {prefix}__pending__/{txn}/
    recover  the txn ids of the prefixes under {prefix}__pending__/

A batch is one object, so the copy on commit makes it visible in one step.
A crash between the copy and the delete leaves both; the data object decides
(it exists, so the txn is committed) and recover() finishes the clean-up
instead of listing it. Rows are JSON Lines, checked at stage time.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from semel.eos.outcomes import OK, Fatal, SinkOutcome
from semel.eos.sink import TwoPhaseSink
from semel.eos.sinks.rows import encode_json_row

PENDING = "__pending__/"
BATCH = "batch.jsonl"


class S3Sink(TwoPhaseSink):
    def __init__(self, bucket: str, prefix: str = "", *, client: Any = None, data_dir: str = "data/",
                 name: str = "s3", timeout: float | None = 30.0, **client_kwargs: Any):
        if not bucket:
            raise ValueError("bucket must be non-empty")
        if prefix and not prefix.endswith("/"):
            raise ValueError(f"prefix must be empty or end with '/', got {prefix!r}")
        if not data_dir.endswith("/") or data_dir.startswith(PENDING):
            raise ValueError(f"data_dir must end with '/' and not be the pending area, got {data_dir!r}")
        if client is None:
            import boto3
            client = boto3.client("s3", **client_kwargs)
        self.s3 = client
        self.bucket, self.prefix, self.data_dir = bucket, prefix, data_dir
        self.name, self.timeout = name, timeout
        self.staged: list[str] = []

    def _pending_prefix(self, txn_id: str) -> str:
        if not txn_id or "/" in txn_id:
            raise ValueError(f"txn id not usable in an S3 key: {txn_id!r}")
        return f"{self.prefix}{PENDING}{txn_id}/"

    def _data_key(self, txn_id: str) -> str:
        return f"{self.prefix}{self.data_dir}{txn_id}.jsonl"

    def _exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError
        try:
            self.s3.head_object(Bucket=self.bucket, Key=key)
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def _pending_keys(self, txn_id: str) -> list[str]:
        keys = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                      Prefix=self._pending_prefix(txn_id)):
            keys += [o["Key"] for o in page.get("Contents", [])]
        return keys

    def _delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            chunk = keys[i:i + 1000]
            resp = self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in chunk],
                                                                      "Quiet": True})
            if resp.get("Errors"):
                raise RuntimeError(f"delete failed for {len(resp['Errors'])} objects: {resp['Errors'][0]}")

    # ------------------------------------------------------------ contract
    def stage(self, row: Any) -> None:
        self.staged.append(encode_json_row(row, "s3"))

    def prepare(self, txn_id: str, rows: Sequence[Any] = ()) -> SinkOutcome:
        lines = self.staged + [encode_json_row(r, "s3") for r in rows]
        key = self._pending_prefix(txn_id) + BATCH
        if self._exists(key) or self._exists(self._data_key(txn_id)):
            if lines:
                return Fatal(f"{txn_id} is already prepared; refusing to drop {len(lines)} new rows")
            return OK
        self.s3.put_object(Bucket=self.bucket, Key=key, Body="".join(x + "\n" for x in lines).encode())
        self.staged = []
        return OK

    def commit(self, txn_id: str) -> SinkOutcome:
        data_key = self._data_key(txn_id)
        pending = self._pending_keys(txn_id)
        if not self._exists(data_key):
            if self._pending_prefix(txn_id) + BATCH not in pending:
                return Fatal(f"{txn_id} is not prepared; nothing to commit")
            self.s3.copy_object(Bucket=self.bucket, Key=data_key,
                                CopySource={"Bucket": self.bucket, "Key": self._pending_prefix(txn_id) + BATCH})
        if pending:
            self._delete(pending)
        return OK

    def abort(self, txn_id: str) -> SinkOutcome:
        self.staged = []
        if self._exists(self._data_key(txn_id)):
            return Fatal(f"{txn_id} is already committed; cannot abort")
        pending = self._pending_keys(txn_id)
        if pending:
            self._delete(pending)
        return OK

    def recover(self) -> list[str]:
        out = []
        base = self.prefix + PENDING
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base,
                                                                      Delimiter="/"):
            for cp in page.get("CommonPrefixes", []):
                txn_id = cp["Prefix"][len(base):].rstrip("/")
                if self._exists(self._data_key(txn_id)):
                    self._delete(self._pending_keys(txn_id))  # committed; only the clean-up was missing
                else:
                    out.append(txn_id)
        return sorted(out)

    # ------------------------------------------------------------ readers
    def committed_batches(self) -> dict[str, list]:
        out = {}
        base = self.prefix + self.data_dir
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
            for o in page.get("Contents", []):
                key = o["Key"]
                if key.endswith(".jsonl"):
                    body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read().decode()
                    out[key[len(base):-len(".jsonl")]] = [json.loads(x) for x in body.splitlines() if x]
        return out
