"""`semel console` in a real browser (Debian's chromium, headless, driven by Playwright)
against a real broker, as an operator uses it:

- a transaction left open by confluent-kafka's transactional producer appears on
  /transactions with its age and the LSO gap it causes (also on /topics), and
  aborting it from the page (confirming the dialog that says what it will do)
  clears the gap;
- a consumer group's lag on /groups moves as the group consumes; its offsets are
  reset and a partition's records deleted from the page; a subscribed group shows
  its member's assignment (classic and KIP-848 protocols); a share group shows its
  members and, per share-partition, its start offset, lag and window by record state,
  and its start offsets are reset from the page once it has no members;
- the live chart fills from the server-sent events without a reload;
- a console started without --allow-writes offers no write and refuses one;
- /check shows a real `semel check` run: verdict, timeline, faults;
- a hanging transaction (its coordinator state lost) is flagged and aborted in its
  partition from the page.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from playwright.sync_api import expect

from semel.client import Client
from semel.protocol.errors import KafkaError
from tests.support.brokers import module_broker_fixture
from tests.support.console import browser_page, console_process, get, post, screenshot
from tests.support.wait import until

broker = module_broker_fixture("console", "--group-initial-rebalance-delay-ms", "0")


@pytest.fixture(scope="module")
def console(broker, tmp_path_factory):
    with console_process(broker.bootstrap, tmp_path_factory.mktemp("console") / "console.log",
                         "--allow-writes") as url:
        yield url


@pytest.fixture(scope="module")
def page(console):
    with browser_page() as p:
        yield p


def _topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    with Client(bootstrap) as c:
        assert c.create_topic(name, partitions) == KafkaError.NONE


def test_open_transaction_shown_with_its_gap_and_aborted_from_the_page(broker, console, page, tmp_path):
    _topic(broker.bootstrap, "payments", 2)
    committed = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(3):
        committed.produce("payments", f"ok-{i}".encode(), partition=0)
    committed.flush(30)
    stuck = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "payments-copier",
                      "transaction.timeout.ms": 60_000})
    stuck.init_transactions(30)
    stuck.begin_transaction()
    for i in range(5):
        stuck.produce("payments", f"open-{i}".encode(), partition=0)
    stuck.flush(30)   # sent and acknowledged; the transaction stays open

    page.goto(f"{console}/transactions")
    row = page.locator("#txn-payments-copier")
    expect(row).to_have_attribute("data-gap", "5")
    expect(row.locator(".holds")).to_contain_text("payments-0: 5 records")
    expect(row).to_contain_text("Ongoing")
    # The age counts up live (server-sent events), against the 60 s timeout.
    expect(row.locator(".age")).to_contain_text("/ 60 s")
    first_age = int(row.get_attribute("data-age"))
    expect(row).not_to_have_attribute("data-age", str(first_age), timeout=10_000)
    screenshot(page, tmp_path, "transactions")

    page.goto(f"{console}/topics")
    tp = page.locator("#tp-payments-0")
    expect(tp).to_have_attribute("data-gap", "5")
    expect(tp).to_have_attribute("data-hw", "8")
    expect(tp).to_have_attribute("data-lso", "3")
    screenshot(page, tmp_path, "topics")

    page.goto(f"{console}/transactions")
    dialogs: list[str] = []

    def accept(dialog):
        dialogs.append(dialog.message)
        dialog.accept()
    page.once("dialog", accept)
    page.locator("#txn-payments-copier button").click()
    expect(page.locator("#flash")).to_contain_text("aborted 'payments-copier'")
    assert "Abort transaction 'payments-copier'" in dialogs[0] and "payments-0" in dialogs[0], dialogs
    expect(page.locator("#txn-payments-copier")).to_have_count(0)

    page.goto(f"{console}/topics")
    expect(page.locator("#tp-payments-0")).to_have_attribute("data-gap", "0")
    # The abort marker took an offset; every record is now readable under read_committed.
    expect(page.locator("#tp-payments-0")).to_have_attribute("data-lso", "9")


def test_group_lag_moves_as_it_consumes(broker, console, page, tmp_path):
    _topic(broker.bootstrap, "clicks")
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(100):
        p.produce("clicks", f"c-{i}".encode(), partition=0)
    p.flush(30)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "click-readers", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition("clicks", 0, 0)])
        got = _consume(c, 40)
        c.commit(offsets=[TopicPartition("clicks", 0, got)], asynchronous=False)

        page.goto(f"{console}/groups")
        lag = page.locator("#lag-click-readers-clicks-0")
        expect(lag).to_have_attribute("data-lag", "60")
        screenshot(page, tmp_path, "groups")

        got += _consume(c, 60)
        c.commit(offsets=[TopicPartition("clicks", 0, got)], asynchronous=False)
        expect(lag).to_have_attribute("data-lag", "0")
    finally:
        c.close()

    # Writes from the page: the group (it has no members: the consumer assigned its
    # partition itself) is reset to the earliest offsets, then the topic's records are
    # deleted up to the high watermark, each after a confirmation saying what it does.
    page.once("dialog", lambda d: d.accept() if "Commit the earliest offsets of 1 partition(s) for group "
              "click-readers" in d.message else d.dismiss())
    page.locator("#group-click-readers button", has_text="reset to earliest").click()
    expect(page.locator("#flash")).to_contain_text("reset 1 partition(s) of group click-readers")
    expect(lag).to_have_attribute("data-lag", "100")

    page.goto(f"{console}/topics")
    page.once("dialog", lambda d: d.accept() if "before offset 100" in d.message else d.dismiss())
    page.locator("#tp-clicks-0 button").click()
    expect(page.locator("#flash")).to_contain_text("clicks-0: records before 100 deleted; log start now 100")
    expect(page.locator("#tp-clicks-0")).to_have_attribute("data-start", "100")


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_group_members_and_their_assignment(broker, console, page, protocol):
    """A subscribed consumer's group: its protocol, state and member with the partitions
    it was assigned (decoded from the classic protocol's assignment bytes, or read from
    ConsumerGroupDescribe for the KIP-848 consumer protocol)."""
    topic, group = f"views-{protocol}", f"view-readers-{protocol}"
    _topic(broker.bootstrap, topic, 2)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "group.protocol": protocol,
                  "auto.offset.reset": "earliest", "client.id": f"viewer-{protocol}"})
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 60
        while not c.assignment():
            assert time.monotonic() < deadline, "never assigned"
            c.poll(0.2)
        page.goto(f"{console}/groups")
        section = page.locator(f"#group-{group}")
        expect(section).to_contain_text(f"{protocol} protocol")
        expect(section.locator(".members")).to_contain_text(f"viewer-{protocol}")
        expect(section.locator(".members .assigned")).to_have_text(f"{topic}-0, {topic}-1")
    finally:
        c.close()


def test_share_group_start_offsets_and_window(broker, console, page, tmp_path):
    from tests.support.share_wire import fetch, holding, leave
    topic, group = "queue-jobs", "queue-workers"
    with holding(broker.bootstrap, group, topic, 5, 3) as (s, member, tid):   # holds 0..2
        page.goto(f"{console}/groups")
        section = page.locator(f"#group-{group}")
        expect(section).to_contain_text("share protocol")
        expect(section.locator(".members")).to_contain_text(member)
        row = page.locator(f"#share-{group}-{topic}-0")
        expect(row).to_have_attribute("data-start", "0")
        expect(row).to_have_attribute("data-acquired", "3")
        screenshot(page, tmp_path, "share-groups")
        # It accepts what it held and takes the rest: the start offset moves past them.
        assert fetch(s, group, member, 1, tid, acks=[(0, 2, 1)], max_records=2).error_code == 0
        expect(row).to_have_attribute("data-start", "3")
        expect(row).to_have_attribute("data-acquired", "2")
        # The member leaves; its start offset is reset from the page.
        leave(s, group, member)
        expect(section).to_contain_text("Empty")
        page.once("dialog", lambda d: d.accept() if "Move the start offsets of 1 share-partition(s) of share group "
                  f"{group} to the earliest offsets" in d.message else d.dismiss())
        section.locator("button", has_text="reset to earliest").click()
        expect(page.locator("#flash")).to_contain_text(f"reset 1 partition(s) of group {group} to the earliest")
        expect(row).to_have_attribute("data-start", "0")
        expect(row).to_have_attribute("data-acquired", "0")


def _consume(c: Consumer, n: int) -> int:
    got = 0
    deadline = time.monotonic() + 60
    while got < n:
        assert time.monotonic() < deadline, f"consumed {got} of {n}"
        for m in c.consume(n - got, timeout=1):
            assert m.error() is None, m.error()
            got += 1
    return got


def test_brokers_page_and_live_chart(console, page, tmp_path):
    page.goto(f"{console}/brokers")
    expect(page.locator("#broker-0")).to_have_attribute("data-live", "yes")
    expect(page.locator("#broker-0")).to_contain_text("controller")
    # The chart is fed by /events/series: its point count grows without a reload.
    chart = page.locator("#chart")
    expect(chart).to_have_attribute("data-points", re.compile(r"\d+"))
    before = int(chart.get_attribute("data-points"))
    page.wait_for_function(f"Number(document.getElementById('chart').dataset.points) > {before}")
    screenshot(page, tmp_path, "brokers")
    for name in ("spark", "check"):
        page.goto(f"{console}/{name}")
        expect(page.locator("#live")).to_contain_text("Start the console with")


@pytest.fixture()
def console_bin_args(broker, tmp_path):
    """console_process's arguments for a second, read-only console on the same broker."""
    return broker.bootstrap, tmp_path / "console-2.log"


def test_read_only_console_refuses_writes(console_bin_args, page):
    with console_process(*console_bin_args) as url:
        status, body = post(url, "/actions/abort", {"key": "anything"})
        assert status == 403 and "read-only" in body, (status, body)
        page.goto(f"{url}/topics")
        expect(page.locator("header .mode")).to_have_text("read-only")
        expect(page.locator("#partitions")).to_be_visible()
        expect(page.locator("button")).to_have_count(0)


def test_check_report_page(console_bin_args, page, tmp_path):
    """A real `semel check` run (a few seconds against its own broker, killed twice) shown
    on /check: the verdict, the timeline of its history, and the faults in time order."""
    out = tmp_path / "check"
    r = subprocess.run([sys.executable, "-m", "semel", "check", "--spawn-semel", "--duration", "4", "--seed", "7",
                        "--faults", "broker-kill", "--fault-interval", "1", "2", "--no-plot", "--out", str(out)],
                       capture_output=True, text=True, timeout=240)
    assert (out / "summary.json").exists(), r.stdout[-3000:] + r.stderr[-3000:]
    valid = json.loads((out / "summary.json").read_text())["valid"]
    with console_process(*console_bin_args, "--check-report", str(out)) as url:
        page.goto(f"{url}/check")
        expect(page.locator("#verdict")).to_contain_text("VALID" if valid else "INVALID")
        expect(page.locator("#timeline canvas")).to_be_attached()
        expect(page.locator("#events")).to_contain_text("fault: kill-broker down_s=")
        screenshot(page, tmp_path, "check")


def test_writes_only_from_the_consoles_own_pages(broker, console):
    """Another site's form, or script, posting from the operator's browser is refused
    (no htmx header, or a foreign Origin); a foreign Host name gets nothing at all."""
    _topic(broker.bootstrap, "guarded")
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "guarded-copier"})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("guarded", b"x", partition=0)
    p.flush(30)
    try:
        until(lambda: 'id="txn-guarded-copier"' in get(console, "/transactions"), "the console lists it")
        status, body = post(console, "/actions/abort", {"key": "guarded-copier"})
        assert status == 403 and "only from the console" in body, (status, body)
        status, body = post(console, "/actions/abort", {"key": "guarded-copier"},
                            {"HX-Request": "true", "Origin": "http://evil.example"})
        assert status == 403 and "http://evil.example is not taken" in body, (status, body)
        status, _ = post(console, "/brokers", {}, {"Host": "evil.example"})
        assert status == 400
        assert 'id="txn-guarded-copier"' in get(console, "/transactions")   # still open
    finally:
        p.abort_transaction(30)


def test_hanging_transaction_flagged_and_aborted_in_its_partition(broker, console, page, tmp_path):
    """KIP-664's hanging transaction, made the way they arise: a producer leaves a
    transaction open and the coordinator's state is lost (removed while the broker is
    down). The page flags it (producer state no coordinator transaction owns) with the
    gap it holds; aborting it writes the ABORT marker in its partition. Runs last: it
    restarts the module's broker, and the console carries on across the restart."""
    _topic(broker.bootstrap, "ledger")
    stuck = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "ledger-copier"})
    stuck.init_transactions(30)
    stuck.begin_transaction()
    for i in range(3):
        stuck.produce("ledger", f"lost-{i}".encode(), partition=0)
    stuck.flush(30)
    broker.stop()
    shutil.rmtree(broker.data_dir / "__transaction_state-0")   # the coordinator forgets the transaction
    broker.start()

    page.goto(f"{console}/transactions")
    row = page.locator("#txns tr.bad", has_text="ledger-0")
    expect(row).to_contain_text("no coordinator transaction owns it: nothing will end it", timeout=30_000)
    expect(row.locator(".holds")).to_have_text("ledger-0: 3 records")
    screenshot(page, tmp_path, "transactions-hanging")
    page.once("dialog", lambda d: d.accept() if "Write an ABORT marker for producer" in d.message else d.dismiss())
    row.locator("button").click()
    expect(page.locator("#flash")).to_contain_text("transaction in ledger-0")
    expect(row).to_have_count(0)
    page.goto(f"{console}/topics")
    expect(page.locator("#tp-ledger-0")).to_have_attribute("data-gap", "0")


def test_console_refuses_bad_options_in_one_line(tmp_path):
    """Before serving anything: a SASL login without its password, a missing report."""
    env = {k: v for k, v in os.environ.items() if k != "SEMEL_SASL_PASSWORD"}
    for extra, said in ((["--sasl-mechanism", "PLAIN", "--sasl-username", "ops"], "the password in $SEMEL_SASL_PASSWORD"),
                        (["--check-report", str(tmp_path / "none")], "--check-report: no directory at")):
        r = subprocess.run([sys.executable, "-m", "semel", "console", "--bootstrap", "127.0.0.1:1", *extra],
                           capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and said in r.stderr, r.stderr
