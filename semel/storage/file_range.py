"""A range of a segment file handed to the socket without being read into Python.

A follower's fetch is answered with whole batches as they lie on disk; on a plain
TCP connection the broker sends them with os.sendfile (page cache to socket, no
copy through the process) and reads them only where it cannot (TLS, or a socket
that would block). The range holds its own duplicate of the file descriptor, so it
stays valid whatever happens to the segment before it is sent (closed, deleted);
a file cut shorter meanwhile (a truncation) makes read() fail rather than send
fewer bytes than the response's framing announced.
"""
from __future__ import annotations

import os


class FileRange:
    __slots__ = ("fd", "pos", "length")

    def __init__(self, fd: int, pos: int, length: int):
        self.fd = os.dup(fd)
        self.pos = pos
        self.length = length

    def __len__(self) -> int:
        return self.length

    def read(self, skip: int = 0) -> bytes:
        """The bytes from `skip` on; OSError when the file no longer holds them all."""
        want = self.length - skip
        parts, got = [], 0
        while got < want:
            more = os.pread(self.fd, want - got, self.pos + skip + got)
            if not more:
                raise OSError(f"file range cut short: {got} of {want} bytes left")
            parts.append(more)
            got += len(more)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def __bytes__(self) -> bytes:
        return self.read()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:   # a response dropped unsent (connection closed) still lets go
        self.close()
