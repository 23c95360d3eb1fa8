"""The listener a test broker offers (plaintext, TLS, SASL, both) and the matching
settings of each client library, so a test splats one dict into its client.

TLS uses a throwaway CA made per broker (semel.testing.certs, the `cryptography`
package); SASL one user, a super user, checked with PLAIN or SCRAM.
"""
from __future__ import annotations

import os
import ssl
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..client.client import Client
from ..client.security import Secret, Security, Tls

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


@dataclass
class ClientSecurity:
    """How clients log in to a test broker; `setup()` makes the broker's side."""
    protocol: str = "PLAINTEXT"
    mechanism: str = "SCRAM-SHA-256"
    username: str = "alice"
    password: str = "alice-secret"
    ca_file: Path | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.protocol = self.protocol.upper()
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"security must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    def setup(self, base: Path) -> list[str]:
        """The broker's flags for this listener; makes the certificates under base/tls."""
        if self.protocol == "PLAINTEXT":
            return []
        args = ["--security-protocol", self.protocol]
        if self.tls:
            from .certs import make_certs   # cryptography: only TLS brokers need it
            (base / "tls").mkdir(parents=True, exist_ok=True)
            self.ca_file, cert, key = make_certs(base / "tls")
            args += ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]
        if self.sasl:
            args += ["--sasl-mechanisms", "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512", "--super-user", f"User:{self.username}"]
        return args

    def prepare(self, data_dir: Path) -> None:
        """Before the broker's first start: its user (the `semel user` command writes the
        data dir's users file, as an operator would)."""
        if not self.sasl or (data_dir / "__users.json").exists():
            return
        data_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, SEMEL_TEST_PASSWORD=self.password)
        r = subprocess.run([sys.executable, "-m", "semel", "user", "add", self.username, "--data-dir", str(data_dir),
                            "--password-env", "SEMEL_TEST_PASSWORD"], env=env, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"semel user add failed: {(r.stderr or r.stdout).strip()}")

    def connect(self, bootstrap: str, timeout_s: float = 10.0) -> Client:
        """A semel Client logged in as the tests' user (the topic factory's connection)."""
        tls = Tls(ca_file=str(self.ca_file)) if self.tls else None
        sec = Security(protocol=self.protocol, mechanism=self.mechanism if self.sasl else None,
                       username=self.username if self.sasl else None,
                       password=Secret(self.password) if self.sasl else None, tls=tls)
        return sec.connect(bootstrap.split(",")[0], "semel-pytest", timeout_s)


def client_configs(bootstrap: str, sec: ClientSecurity) -> dict[str, dict]:
    """Each library's settings for this broker, by library: "confluent" (confluent-kafka,
    librdkafka's names), "kafka_python" and "aiokafka" (keyword arguments).

    librdkafka's re-bootstrap is off: after a restart of a test's only broker it can
    leave send_offsets_to_transaction waiting for ever (docs/librdkafka-restart-hang.md);
    a test broker keeps its address, so there is nothing to re-bootstrap to."""
    confluent: dict = {"bootstrap.servers": bootstrap, "metadata.recovery.strategy": "none"}
    kafka_python: dict = {"bootstrap_servers": bootstrap}
    aiokafka: dict = {"bootstrap_servers": bootstrap}
    if sec.protocol != "PLAINTEXT":
        confluent["security.protocol"] = sec.protocol
        kafka_python["security_protocol"] = aiokafka["security_protocol"] = sec.protocol
    if sec.tls:
        confluent["ssl.ca.location"] = kafka_python["ssl_cafile"] = str(sec.ca_file)
        aiokafka["ssl_context"] = ssl.create_default_context(cafile=str(sec.ca_file))
    if sec.sasl:
        confluent.update({"sasl.mechanism": sec.mechanism, "sasl.username": sec.username,
                          "sasl.password": sec.password})
        for c in (kafka_python, aiokafka):
            c.update(sasl_mechanism=sec.mechanism, sasl_plain_username=sec.username,
                     sasl_plain_password=sec.password)
    return {"confluent": confluent, "kafka_python": kafka_python, "aiokafka": aiokafka}
