"""Storage: partition logs on disk, their recovery, producer state, and the topic catalogue.

Sits on semel.protocol only. Public API:
    PartitionLog, LogConfig, RecoveryInfo, AppendInfo          (log.py and its parts; types.py)
    ProducerStateManager, ProducerEntry                        (producer_state.py)
    TxnIndex, AbortedTxn                                       (txn_index.py)
    GroupCommitFlusher, run_interval_flush                     (flusher.py)
    LogManager, TopicInfo                                      (manager.py)
    FileSystem, FaultyFileSystem, fs_from_env                  (fs.py)
    AppendError, StorageError, ProducerStateError, OffsetOutOfRange  (errors.py)
"""
from .errors import AppendError, OffsetOutOfRange, ProducerStateError, StorageError
from .flusher import GroupCommitFlusher, run_interval_flush
from .fs import FaultyFileSystem, FileSystem, fs_from_env
from .log import LogConfig, PartitionLog, RecoveryInfo
from .manager import LogManager, TopicInfo
from .producer_state import ProducerEntry, ProducerStateManager
from .txn_index import AbortedTxn, TxnIndex
from .types import AppendInfo

__all__ = [
    "AppendError", "OffsetOutOfRange", "ProducerStateError", "StorageError",
    "GroupCommitFlusher", "run_interval_flush",
    "FaultyFileSystem", "FileSystem", "fs_from_env",
    "AppendInfo", "LogConfig", "PartitionLog", "RecoveryInfo",
    "LogManager", "TopicInfo",
    "ProducerEntry", "ProducerStateManager",
    "AbortedTxn", "TxnIndex",
]
