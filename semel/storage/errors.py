"""Exceptions of the storage layer, each carrying the Kafka error the broker should answer with.

Storage raises instead of returning error values because a failed append must
unwind several steps at once (the write, the roll, the producer-state check);
every exception here carries `.error`, so handlers turn it back into a value in
one line: `except AppendError as exc: return exc.error`.
"""
from __future__ import annotations

from semel.protocol.errors import KafkaError


class AppendError(Exception):
    """An append was refused; nothing was written."""

    def __init__(self, error: KafkaError, message: str = ""):
        super().__init__(message or error.name)
        self.error = error


class StorageError(AppendError):
    """The disk failed (write, fsync, rename, full disk). The log is unchanged."""

    def __init__(self, message: str = ""):
        super().__init__(KafkaError.KAFKA_STORAGE_ERROR, message)


class CorruptLogError(StorageError):
    """Bytes read back from a segment are not the batches written there (damaged on
    disk). The message names the file and offset; `first_report` is False when the
    same damage was reported before (callers log it once)."""

    def __init__(self, message: str, path: str, offset: int, first_report: bool = True):
        super().__init__(message)
        self.path = path
        self.offset = offset
        self.first_report = first_report


class ProducerStateError(AppendError):
    """Idempotence / transaction rules rejected a batch (sequence, epoch, txn state)."""


class OffsetOutOfRange(Exception):
    """A read or lookup asked for an offset outside [log_start_offset, log_end_offset]."""

    error = KafkaError.OFFSET_OUT_OF_RANGE

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int):
        super().__init__(f"offset {offset} is outside [{log_start_offset}, {log_end_offset}]")
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset
