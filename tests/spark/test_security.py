"""format("semel") against a secured semel broker: Spark's `kafka.*` security options on
every connection (driver, commit() worker, executors), the ACLs docs/spark.md lists
being enough for exactly-once source -> sink, and a missing one failing the query at its
start with the resource named. One broker for the module: SASL_PLAINTEXT on --port,
SASL_SSL with a throwaway CA on a second listener; SCRAM users added with `semel user`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.errors import StreamingQueryException

from semel.client.cluster import ClusterRouter, ReaderError
from semel.client.security import from_config
from semel.launch.process import SemelBroker, free_port
from semel.spark import sink
from tests.support import wait
from semel.testing.certs import make_certs
from tests.support.consume import read_values

# Escapes in the JAAS line (a quote, a backslash, a ';') must reach the broker intact.
PASSWORDS = {"admin": "admin-secret", "alice": 'al"ice\\sec;ret-1', "bob": "bob-secret-2", "carol": "carol-secret-3",
             "dave": "dave-secret-4", "erin": "erin-secret-5"}
SECRETS = [p for p in PASSWORDS.values()] + ["sec;ret", "secret-2", "secret-3", "secret-4"]


def _semel(data_dir, *args, env=None):
    r = subprocess.run([sys.executable, "-m", "semel", *args, "--data-dir", str(data_dir)], capture_output=True,
                       text=True, env=dict(os.environ, **(env or {})), timeout=120)
    assert r.returncode == 0, r.stderr


def jaas(user: str, module: str = "scram.ScramLoginModule") -> str:
    pw = PASSWORDS[user].replace("\\", "\\\\").replace('"', '\\"')
    return f'org.apache.kafka.common.security.{module} required username="{user}" password="{pw}";'


class Secured:
    def __init__(self, broker, tls_port, ca, broker_log):
        self.broker, self.tls_port, self.ca, self.broker_log = broker, tls_port, ca, broker_log
        self.tls = f"127.0.0.1:{tls_port}"

    def spark_options(self, user: str) -> dict[str, str]:
        """What a Spark user passes for SASL_SSL + SCRAM (PEM trust store, host name checked)."""
        return {"kafka.bootstrap.servers": self.tls, "kafka.security.protocol": "SASL_SSL",
                "kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.sasl.jaas.config": jaas(user),
                "kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": str(self.ca),
                "kafka.ssl.endpoint.identification.algorithm": "https"}

    def admin_config(self) -> dict:
        return {"bootstrap.servers": self.tls, "security.protocol": "SASL_SSL", "ssl.ca.location": str(self.ca),
                "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "admin", "sasl.password": PASSWORDS["admin"]}

    def acl(self, *args: str) -> None:
        _semel(self.broker.data_dir, "acl", "add", *args)

    def grant_documented(self, user: str, source: str, sink: str, group: str) -> None:
        """Exactly the `semel acl add` lines docs/spark.md's Security section shows, for
        this user, topics and group."""
        names = {"User:alice": f"User:{user}", "in": source, "out": sink, "orders-query": group,
                 "semel-spark-orders-query": f"semel-spark-{group}"}
        for args in documented_acls():
            self.acl(*[names.get(a, a) for a in args])


def documented_acls() -> list[list[str]]:
    doc = (Path(__file__).parents[2] / "docs" / "spark.md").read_text()
    section = doc.split("### ACLs the connector needs", 1)[1].split("\n## ", 1)[0]
    lines = [ln.split()[5:] for ln in section.splitlines() if ln.startswith("    semel acl add --data-dir d ")]
    assert len(lines) == 4, lines
    return lines


@pytest.fixture(scope="module")
def sec(tmp_path_factory):
    d = tmp_path_factory.mktemp("spark-security")
    data = d / "data"
    data.mkdir()
    for name, pw in PASSWORDS.items():
        _semel(data, "user", "add", name, "--password-env", "SEMEL_PW", env={"SEMEL_PW": pw})
    ca, cert, key = make_certs(d)
    tls_port = free_port()
    b = SemelBroker(data, log_path=d / "broker.log", extra_args=[
        "--security-protocol", "SASL_PLAINTEXT", "--listener", f"SASL_SSL://127.0.0.1:{tls_port}",
        "--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--super-user", "User:admin",
        "--sasl-mechanisms", "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER",
        "--group-initial-rebalance-delay-ms", "0"])
    b.start()
    try:
        s = Secured(b, tls_port, ca, d / "broker.log")
        wait.until(lambda: _metadata_ok(s), "the SASL_SSL listener answers")
        admin = AdminClient(s.admin_config())
        for f in admin.create_topics([NewTopic(t, 2) for t in ("sec-in", "sec-out", "sec-in-b", "sec-out-b", "sec-in-e")]).values():
            f.result(30)
        del admin
        yield s
    finally:
        b.close()


def _metadata_ok(s: Secured) -> bool:
    try:
        with ClusterRouter(s.tls, timeout_s=2, security=from_config(s.spark_options("admin"), prefix="kafka.")):
            return True
    except ReaderError:
        return False


def produce(s: Secured, topic: str, values: list[str]) -> None:
    from confluent_kafka import Producer
    p = Producer(s.admin_config())
    for i, v in enumerate(values):
        p.produce(topic, v.encode(), partition=i % 2)
    assert p.flush(30) == 0


def query(spark, s: Secured, user: str, src: str, dst: str, group: str, checkpoint):
    opts = s.spark_options(user)
    df = spark.readStream.format("semel").options(**opts).option("subscribe", src) \
        .option("startingOffsets", "earliest").load()
    return (df.selectExpr("key", "concat('out-', cast(value as string)) as value").writeStream.format("semel")
            .options(**opts).option("topic", dst).option("kafka.group.id", group)
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())


def no_secret_in(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text


def test_documented_acls_read_and_write_exactly_once(spark, sec, tmp_path):
    sec.grant_documented("alice", "sec-in", "sec-out", "q-alice")
    # the same ACLs let the sink run in mode (a), whose batch joins its branches
    # (pseudo-partitions of the branches' transactional ids)
    o = sink.parse_options({**sec.spark_options("alice"), "topic": "sec-out", "kafka.group.id": "q-alice"})
    assert sink.probe(o).atomic
    produce(sec, "sec-in", [f"a{i}" for i in range(40)] + [f"b{i}" for i in range(20)])
    q = query(spark, sec, "alice", "sec-in", "sec-out", "q-alice", tmp_path / "ck")
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()
    got = read_values(sec.tls, "sec-out", 2, want=60, config={
        k: v for k, v in sec.admin_config().items() if k != "bootstrap.servers"})
    assert sorted(got) == sorted([f"out-a{i}" for i in range(40)] + [f"out-b{i}" for i in range(20)])
    no_secret_in(json.dumps(q.recentProgress, default=str), str(q.lastProgress), q.status and json.dumps(q.status))
    # a batch read over the plaintext SASL listener with PLAIN and the same user
    df = (spark.read.format("semel").option("kafka.bootstrap.servers", sec.broker.bootstrap)
          .option("kafka.security.protocol", "SASL_PLAINTEXT").option("kafka.sasl.mechanism", "PLAIN")
          .option("kafka.sasl.jaas.config", jaas("alice", "plain.PlainLoginModule"))
          .option("subscribe", "sec-in").load())
    assert df.count() == 60
    no_secret_in(df._jdf.queryExecution().toString())   # what explain(True) prints


def test_foreach_batch_with_the_documented_acls(spark, sec, tmp_path):
    """foreach_batch (an external two-phase sink) takes the same options: its parent
    transaction and offsets need only the ACLs the docs list for it."""
    from semel.eos.sinks.filesystem import FileSystemSink
    from semel.spark.foreach import foreach_batch
    produce(sec, "sec-in-e", [f"e{i}" for i in range(30)])
    for args in (["--operation", "read", "--topic", "sec-in-e"], ["--operation", "read", "--group", "q-erin"],
                 ["--operation", "write", "--transactional-id", "semel-spark-q-erin", "--prefixed"]):
        sec.acl("--allow", "User:erin", *args)
    opts = sec.spark_options("erin")
    fn = foreach_batch(lambda d, _b: {"filesystem": [r.v for r in d.collect()]},
                       sinks=[FileSystemSink(tmp_path / "out")], bootstrap=opts.pop("kafka.bootstrap.servers"),
                       checkpoint=str(tmp_path / "ck"), options={**opts, "kafka.group.id": "q-erin"})
    q = (spark.readStream.format("semel").options(**sec.spark_options("erin")).option("subscribe", "sec-in-e")
         .option("startingOffsets", "earliest").load().selectExpr("cast(value as string) as v")
         .writeStream.foreachBatch(fn).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()
    rows = [json.loads(line) for f in sorted((tmp_path / "out" / "committed").iterdir())
            for line in f.read_text().splitlines()]
    assert sorted(rows) == sorted(f"e{i}" for i in range(30))


def _failure(spark, sec, user: str, group: str, checkpoint) -> str:
    from pyspark.errors import StreamingQueryException
    q = query(spark, sec, user, "sec-in-b", "sec-out-b", group, checkpoint)
    with pytest.raises(StreamingQueryException) as e:
        q.awaitTermination(180)
    text = str(e.value)
    no_secret_in(text, json.dumps(q.recentProgress, default=str))
    return text


def test_missing_write_on_transactional_ids_fails_at_start_naming_them(spark, sec, tmp_path):
    sec.grant_documented("bob", "sec-in-b", "sec-out-b", "q-bob")
    # everything but the transactional ids: a Deny on them overrides nothing else
    sec.acl("--deny", "User:bob", "--operation", "write", "--transactional-id", "semel-spark-q-bob", "--prefixed")
    produce(sec, "sec-in-b", ["x"])
    text = _failure(spark, sec, "bob", "q-bob", tmp_path / "ck")
    assert "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in text
    assert "Write on the transactional ids with prefix 'semel-spark-q-bob'" in text
    assert read_values(sec.tls, "sec-out-b", 2, idle_s=0.5, config={
        k: v for k, v in sec.admin_config().items() if k != "bootstrap.servers"}) == []


def test_missing_read_on_the_group_fails_at_start_naming_it(spark, sec, tmp_path):
    sec.grant_documented("carol", "sec-in-b", "sec-out-b", "q-carol-other")
    sec.acl("--allow", "User:carol", "--operation", "write", "--transactional-id", "semel-spark-q-carol",
            "--prefixed")
    text = _failure(spark, sec, "carol", "q-carol", tmp_path / "ck")
    assert "GROUP_AUTHORIZATION_FAILED" in text and "Read on the group 'q-carol'" in text


def test_missing_read_on_the_input_topic_names_it(spark, sec):
    """Without Describe a topic is left out of a listing: the error says it is the ACL."""
    df = spark.read.format("semel").options(**sec.spark_options("dave")).option("subscribe", "sec-in")
    with pytest.raises(Exception) as e:
        df.load().count()
    assert "needs Read on the topic(s) sec-in" in str(e.value)
    no_secret_in(str(e.value))


def test_a_stream_fails_on_a_refused_topic_instead_of_waiting_for_it(spark, sec, tmp_path):
    """A stream waits for a subscribed topic that does not exist yet; one the user may not
    read is missing from the listing too, and must fail the query naming the ACL."""
    q = (spark.readStream.format("semel").options(**sec.spark_options("dave")).option("subscribe", "sec-in")
         .load().writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    try:
        with pytest.raises(StreamingQueryException) as e:
            q.awaitTermination(120)   # returns False (no exception) while the query waits
        assert "needs Read on the topic(s) sec-in" in str(e.value)
        no_secret_in(str(e.value))
    finally:
        q.stop()


def test_wrong_password_fails_in_one_line_without_it(spark, sec, tmp_path):
    opts = dict(sec.spark_options("alice"))
    opts["kafka.sasl.jaas.config"] = jaas("alice").replace("al\\\"ice", "wrong")
    df = spark.read.format("semel").options(**opts).option("subscribe", "sec-in")
    with pytest.raises(Exception) as e:
        df.load().count()
    assert "SASL_AUTHENTICATION_FAILED" in str(e.value) or "authentication failed" in str(e.value).lower()
    no_secret_in(str(e.value), sec.broker_log.read_text())


def test_oauthbearer_unsecured_token_logs_in(sec):
    """OAUTHBEARER with Kafka's unsecured login (tests only): the broker takes the token's sub."""
    security = from_config({
        "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
        "ssl.truststore.location": str(sec.ca), "ssl.truststore.type": "PEM",
        "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                            'unsecuredLoginStringClaim_sub="admin";'})
    with ClusterRouter(sec.tls, timeout_s=10, security=security) as c:
        assert c.refresh()["sec-in"] == 2
