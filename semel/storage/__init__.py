"""Storage: partition logs on disk, their recovery, and the topic catalogue.

Sits on semel.protocol only. Public API:
    LogConfig, PartitionLog, AppendInfo            (log.py)
    GroupCommitFlusher, run_interval_flush          (flusher.py)
    LogManager, TopicInfo                           (manager.py)
    FileSystem, FaultyFileSystem, fs_from_env       (fs.py)
    AppendError, StorageError, ProducerStateError, OffsetOutOfRange  (errors.py)
"""
from .errors import AppendError, OffsetOutOfRange, ProducerStateError, StorageError
from .flusher import GroupCommitFlusher, run_interval_flush
from .fs import FaultyFileSystem, FileSystem, fs_from_env
from .log import AppendInfo, LogConfig, PartitionLog
from .manager import LogManager, TopicInfo

__all__ = [
    "AppendError", "OffsetOutOfRange", "ProducerStateError", "StorageError",
    "GroupCommitFlusher", "run_interval_flush",
    "FaultyFileSystem", "FileSystem", "fs_from_env",
    "AppendInfo", "LogConfig", "PartitionLog",
    "LogManager", "TopicInfo",
]
