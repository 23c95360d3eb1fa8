"""The partition nemesis itself: namespaces reach each other through the router, a cut
drops traffic in the asked direction only, heal restores it, close removes everything."""
from __future__ import annotations

import os
import socket
import subprocess

import pytest

from semel.launch.netns import Network, available

WHY = available()
pytestmark = [pytest.mark.process,   # ip(8) and processes in namespaces
              pytest.mark.skipif(WHY is not None and not os.environ.get("CI"), reason=f"no namespaces: {WHY}")]


def _listen(net, host):
    s = net.within(host, socket.create_server, (net.address(host), 7000))
    s.settimeout(0.5)
    return s


def _connects(net, src, dst) -> bool:
    def attempt():
        try:
            with socket.create_connection((net.address(dst), 7000), timeout=0.5):
                return True
        except OSError:
            return False
    return net.within(src, attempt)


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_cut_heal_and_cleanup():
    net = Network(["a", "b", "c"])
    with net:
        servers = [_listen(net, h) for h in ("a", "b", "c")]
        assert _connects(net, "a", "b") and _connects(net, "b", "a") and _connects(net, "c", "a")
        net.cut("a", "b")
        assert not _connects(net, "a", "b") and not _connects(net, "b", "a")
        assert _connects(net, "a", "c") and _connects(net, "c", "b")
        net.heal()
        assert _connects(net, "a", "b")
        # One way: b's packets to a are dropped, so b cannot even open a connection to
        # a, while a's SYN reaches b (its answer is dropped: no connection either).
        net.cut("b", "a", one_way=True)
        assert not _connects(net, "b", "a")
        assert _connects(net, "c", "a")
        net.isolate("c")
        assert not _connects(net, "c", "a") and not _connects(net, "a", "c")
        for s in servers:
            s.close()
        assert net.router in _namespaces()
    assert net.tag not in _namespaces()
    # The root namespace never learnt the private subnet.
    assert "10.213." not in subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
