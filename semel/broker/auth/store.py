"""A small JSON document under the data dir, written atomically and shared by the
running broker and the CLI: writes take an flock on a side file (read-modify-write
from two processes must not lose an update) and readers reload when the file's
mtime/size changed, so a change made by `semel user|acl` applies without a restart."""
from __future__ import annotations

import fcntl
import json
import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from ...storage.fs import FileSystem

log = logging.getLogger("semel.broker.auth")


class JsonStore:
    def __init__(self, path: Path, empty: Callable[[], Any], check: Callable[[Any], Any] | None = None):
        self.path = Path(path)
        self._empty = empty
        self._check = check   # raises on a document of the wrong shape
        self._stamp: tuple[int, int, int] | None = None
        self._doc: Any = empty()
        self._loaded = False

    def _current_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def read(self) -> Any:
        """The document, re-read only when the file changed since the last read."""
        stamp = self._current_stamp()
        if stamp != self._stamp:
            try:
                doc = self._load() if stamp is not None else self._empty()
            except ValueError:
                if not self._loaded:
                    raise   # at start: the broker refuses to run on it (one line naming the file)
                # Running: keep the last good users/ACLs (failing open would drop every ACL).
                log.error("%s changed but cannot be read; keeping the previous contents", self.path)
                self._stamp = stamp
                return self._doc
            self._doc, self._stamp, self._loaded = doc, stamp, True
        return self._doc

    def _load(self) -> Any:
        try:
            doc = json.loads(self.path.read_text())
            if not isinstance(doc, type(self._empty())):
                raise ValueError(f"expected a JSON {type(self._empty()).__name__}")
            if self._check is not None:
                self._check(doc)
            return doc
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{self.path}: unreadable security file ({exc!r})") from None

    @contextmanager
    def update(self) -> Iterator[Any]:
        """Yields the document to change in place; written back atomically on exit."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            doc = self._load() if self.path.exists() else self._empty()
            yield doc
            data = json.dumps(doc, indent=1, sort_keys=True).encode()
            FileSystem().write_atomic(self.path, data)   # tmp + fsync + rename + dir fsync
        self._stamp = None
