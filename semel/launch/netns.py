"""A private network of Linux network namespaces on this machine, with links that can
be cut: the partition nemesis of the tests (and of `semel check`).

Each host (a broker, etcd, a client) gets its own namespace with one interface,
address 10.213.<n>.2/24, and a default route to a router namespace that forwards
between them (10.213.<n>.1 on its side). Nothing connects the router to the machine's
own network, so traffic stays inside the namespaces created here.

A cut is a policy-routing rule in the router, `from A to B blackhole`: packets from A
to B are dropped there without an answer, as on a real partition (a TCP connection
hangs and a connect times out; a route in A's own namespace would fail A's sends at
once instead). `cut(a, b)` drops both directions, `cut(a, b, one_way=True)` only
a -> b (TCP between them then stalls too, but b still receives from a); `isolate`
cuts a host from a list of others; `heal` removes cuts.

Processes run inside a namespace with `ip netns exec`; a ManagedProcess is placed
there with `place`, which also makes its start wait for it from inside. `within(host,
fn)` runs a function in a thread that entered the host's namespace, so a test can
talk to a broker as a client in that namespace would.

Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and iproute2.
"""
from __future__ import annotations

import ctypes
import logging
import os
import shutil
import subprocess
import threading
import uuid
from typing import Callable, Iterable

log = logging.getLogger("semel.launch.netns")

SUBNET = "10.213"
CLONE_NEWNET = 0x40000000
NETNS_DIR = "/var/run/netns"


def available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"semel-probe-{uuid.uuid4().hex[:6]}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode:
        return f"ip netns add failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


class Network:
    """Hosts by name, each in its own namespace behind one router namespace.

    `here`: the host that is the calling process itself, left in the namespace it runs
    in (its link to the router and a route to the hosts' subnet are added there), so a
    test's own clients reach the others and can be cut from them. Its address and
    route are the only change to that namespace, and go with close(); one such
    network at a time per namespace (the route is for the whole subnet)."""

    def __init__(self, hosts: Iterable[str], tag: str | None = None, here: str | None = None):
        self.hosts = list(hosts)
        self.here = here
        if len(self.hosts) > 250:
            raise ValueError("at most 250 hosts")
        self.tag = tag or f"sm{uuid.uuid4().hex[:6]}"
        self.router = f"{self.tag}-r"
        self.index = {h: i + 1 for i, h in enumerate(self.hosts)}
        self.cuts: set[tuple[str, str]] = set()
        self._made: list[str] = []

    # -- names and addresses -----------------------------------------------------------
    def ns(self, host: str) -> str:
        return f"{self.tag}-{self.index[host]}"

    def address(self, host: str) -> str:
        return f"{SUBNET}.{self.index[host]}.2"

    def exec_argv(self, host: str) -> list[str]:
        """The prefix that runs a command inside `host`'s namespace."""
        return [] if host == self.here else ["ip", "netns", "exec", self.ns(host)]

    # -- lifecycle -----------------------------------------------------------------------
    def create(self) -> "Network":
        try:
            self._add_ns(self.router)
            _ip("netns", "exec", self.router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            for host, n in self.index.items():
                if host == self.here:
                    self._link_here(n)
                    continue
                ns = self.ns(host)
                self._add_ns(ns)
                _ip("-n", self.router, "link", "add", f"h{n}", "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("-n", self.router, "addr", "add", f"{SUBNET}.{n}.1/24", "dev", f"h{n}")
                _ip("-n", self.router, "link", "set", f"h{n}", "up")
                _ip("-n", ns, "addr", "add", f"{SUBNET}.{n}.2/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "route", "add", "default", "via", f"{SUBNET}.{n}.1")
        except BaseException:
            self.close()
            raise
        return self

    def _link_here(self, n: int) -> None:
        """The router's link to the caller's own namespace (the `here` host)."""
        end = f"{self.tag}-o"
        _ip("-n", self.router, "link", "add", f"h{n}", "type", "veth", "peer", "name", end, "netns", str(os.getpid()))
        _ip("-n", self.router, "addr", "add", f"{SUBNET}.{n}.1/24", "dev", f"h{n}")
        _ip("-n", self.router, "link", "set", f"h{n}", "up")
        _ip("addr", "add", f"{SUBNET}.{n}.2/24", "dev", end)
        _ip("link", "set", end, "up")
        _ip("route", "add", f"{SUBNET}.0.0/16", "via", f"{SUBNET}.{n}.1")

    def _add_ns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._made.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def close(self) -> None:
        """Delete every namespace made here (their interfaces go with them); the
        processes still running in one keep it until they exit, unseen by others."""
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
        self._made.clear()
        self.cuts.clear()

    def __enter__(self) -> "Network":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- faults ----------------------------------------------------------------------------
    def _rule(self, verb: str, src: str, dst: str) -> None:
        _ip("-n", self.router, "rule", verb, "from", self.address(src), "to", self.address(dst), "blackhole",
            check=verb == "add")

    def cut(self, a: str, b: str, one_way: bool = False) -> None:
        """Drop what `a` sends to `b` (and, unless one_way, what `b` sends to `a`)."""
        for src, dst in [(a, b)] if one_way else [(a, b), (b, a)]:
            if (src, dst) not in self.cuts:
                self._rule("add", src, dst)
                self.cuts.add((src, dst))

    def isolate(self, host: str, others: Iterable[str] | None = None) -> None:
        """Cut `host` from each of `others` (every other host when None), both ways."""
        for other in (self.hosts if others is None else others):
            if other != host:
                self.cut(host, other)

    def heal(self, pairs: Iterable[tuple[str, str]] | None = None) -> None:
        """Remove the cuts of `pairs` (one direction each), or every cut."""
        for src, dst in list(self.cuts if pairs is None else pairs):
            if (src, dst) in self.cuts:
                self._rule("del", src, dst)
                self.cuts.discard((src, dst))

    # -- running things inside -------------------------------------------------------------
    def enter(self, host: str) -> None:
        """Move the calling thread into `host`'s namespace for good: the threads and
        processes it starts from then on are there too (how `semel check` runs its
        clients as one more host of the network)."""
        _setns(os.path.join(NETNS_DIR, self.ns(host)), self.ns(host))

    def within(self, host: str, fn: Callable, *args, **kwargs):
        """fn(*args, **kwargs) in a thread that entered `host`'s network namespace (a
        thread's namespace is its own: the caller's stays as it was)."""
        if host == self.here:
            return fn(*args, **kwargs)
        out: dict = {}

        def run() -> None:
            _setns(os.path.join(NETNS_DIR, self.ns(host)), self.ns(host))
            try:
                out["value"] = fn(*args, **kwargs)
            except BaseException as exc:   # handed to the caller below
                out["error"] = exc
        t = threading.Thread(target=run, name=f"netns-{host}", daemon=True)
        t.start()
        t.join()
        if "error" in out:
            raise out["error"]
        return out.get("value")


def _setns(path: str, name: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {name} failed")
    finally:
        os.close(fd)


def place(proc, net: Network, host: str):
    """`proc` (a ManagedProcess not started yet) runs in `host`'s namespace, bound to its
    address, and its start waits for it from there. Returns proc."""
    cls = type(proc)

    class Placed(cls):
        def command(self) -> list[str]:
            return net.exec_argv(host) + super().command()

        def reach(self, fn, *args):
            return net.within(host, fn, *args)
    Placed.__name__ = f"{cls.__name__}In{host}"
    proc.__class__ = Placed
    proc.host = net.address(host)
    return proc
