"""`semel check --cluster` without processes: option errors, fault defaults, and
the nemesis's choice of victims (the coordinators' broker spared unless asked)."""
from __future__ import annotations

import random

import pytest

from semel.check.cluster import CLUSTER_FAULTS, SETUP_FAULTS, CheckCluster, View, pick
from semel.check.faults import BROKER_FAULTS
from semel.cli.main import main


@pytest.mark.parametrize("args, message", [
    (["--cluster", "--faults", "broker-kill"], "with --cluster the broker faults are"),
    (["--bootstrap", "127.0.0.1:1", "--faults", "leader-kill"], "need --cluster"),
    (["--spawn-semel", "--faults", "broker-pause"], "need --cluster"),
    (["--bootstrap", "127.0.0.1:1", "--nemesis-coordinator"], "--nemesis-coordinator goes with --cluster"),
    (["--cluster", "--nodes", "2"], "--nodes 3 or more"),
    (["--cluster", "--lease-ttl-s", "0"], "--lease-ttl-s must be at least 1"),
])
def test_cluster_option_errors_are_one_line(tmp_path, capsys, args, message):
    assert main(["check", "--no-plot", "--out", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_cluster_and_another_target_are_exclusive(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["check", "--cluster", "--bootstrap", "127.0.0.1:1"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_fault_defaults_and_all(tmp_path):
    from semel.cli.check import _faults
    from semel.cli.main import build_parser
    parse = build_parser().parse_args
    cluster = _faults(parse(["check", "--cluster"]), managed=False)
    # by default the faults that need nothing set up (no FUSE for power cuts, no seams)
    assert set(CLUSTER_FAULTS) - SETUP_FAULTS <= set(cluster) and "broker-kill" not in cluster
    every = _faults(parse(["check", "--cluster", "--faults", "all"]), managed=False)
    assert set(every) == set(CLUSTER_FAULTS) | {"client-kill", "client-pause"}
    # the other targets keep what they had: no cluster fault sneaks in
    assert _faults(parse(["check", "--bootstrap", "h:1"]), managed=False) == ("client-kill", "client-pause")
    managed = _faults(parse(["check", "--spawn-semel", "--faults", "all"]), managed=True)
    assert not (set(CLUSTER_FAULTS) - BROKER_FAULTS) & set(managed)
    assert {"broker-kill", "power-loss"} <= set(managed)


def test_pick_draws_once_whatever_the_candidates():
    assert pick(0.0, []) is None
    assert pick(0.99, [7]) == 7
    assert [pick(x, [1, 2, 3]) for x in (0.0, 0.34, 0.66, 0.67, 0.999)] == [1, 2, 2, 3, 3]


def test_settled_needs_a_leader_and_a_full_isr_everywhere():
    assert View(0, {0: (1, 3, (1, 0, 2)), 1: (2, 0, (2, 1, 0))}).settled(3)
    assert not View(0, {0: (1, 3, (1, 0)), 1: (2, 0, (2, 1, 0))}).settled(3)
    assert not View(0, {0: (-1, 3, (1, 0, 2))}).settled(3)
    assert not View(0, {}).settled(3)


@pytest.mark.parametrize("coordinator", [False, True])
def test_victims_spare_the_coordinators_brokers_unless_asked(tmp_path, coordinator):
    c = CheckCluster(tmp_path, 3, nemesis_coordinator=coordinator)
    # The coordinators live on broker 0 (the controller here is 2: not what is spared).
    v = View(2, {0: (0, 1, (0, 1, 2)), 1: (1, 0, (1, 2, 0)), 2: (2, 0, (2, 0)), 3: (0, 0, (0, 1))}, frozenset({0}))
    if coordinator:
        assert c.leaders(v) == [(0, 0), (1, 1), (2, 2), (3, 0)]
        assert c.followers(v) == [0, 1, 2] and c.pausable(v) == [0, 1, 2]
    else:
        assert c.leaders(v) == [(1, 1), (2, 2)]
        assert c.followers(v) == [1, 2] and c.pausable(v) == [1, 2]
    everything_led_by_a_coordinator = View(2, {0: (0, 1, (0, 1, 2))}, frozenset({0}))
    assert (c.leaders(everything_led_by_a_coordinator) == []) is not coordinator
    apart = View(2, {0: (0, 1, (0, 1, 2)), 1: (1, 0, (1, 2, 0)), 2: (2, 0, (2, 0))}, frozenset({0, 1}))
    assert c.pausable(apart) == ([0, 1, 2] if coordinator else [2])


def test_pauses_half_within_half_past_the_lease(tmp_path):
    c = CheckCluster(tmp_path, 3, lease_ttl_s=3)
    rng = random.Random(1)
    holds = [c._hold("broker-pause", rng) for _ in range(200)]
    assert all(0.3 <= h <= 2.4 or 4.5 <= h <= 7.5 for h in holds)
    assert 60 < sum(h > 3 for h in holds) < 140
    assert all(0.1 <= c._hold("leader-kill", rng) <= 1.5 for _ in range(50))


def test_nemesis_coordinator_help_matches_the_docs(capsys):
    """docs/check.md reports --nemesis-coordinator runs passing; the help must not say
    they are expected to fail."""
    from pathlib import Path
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    docs = " ".join((Path(__file__).parents[3] / "docs" / "check.md").read_text().split())
    assert "--nemesis-coordinator" in help_text and "VALID" in docs
    assert "expected to fail" not in help_text
    assert "expected to fail today" not in docs
