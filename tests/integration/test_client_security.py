"""semel.client.security against a real broker process: PEM client certificates on an
SSL listener that requires them (files and inline text), the host name check and its
opt-out, and OAUTHBEARER tokens from a token endpoint (client credentials) that the
broker checks against the identity provider's keys. The Spark connector opens every
connection this way (tests/spark/test_security.py runs the queries)."""
from __future__ import annotations

import base64
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from semel.client.cluster import ClusterRouter, ReaderError
from semel.client.security import from_config
from semel.launch.process import SemelBroker, free_port
from semel.protocol.errors import KafkaError
from semel.testing.certs import make_certs, make_client_cert
from tests.support.jwks import AUDIENCE, ISSUER, claims, rsa_key, write_jwks

KEY = rsa_key("k1")
CLIENT_ID, CLIENT_SECRET = "spark-app", "client-secret-value"


class TokenEndpoint:
    """An identity provider's token URL: the client-credentials grant with HTTP basic
    auth, answering tokens signed with KEY (sub = the client id)."""

    def __init__(self):
        self.requests: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                form = dict(urllib.parse.parse_qsl(self.rfile.read(int(self.headers["Content-Length"])).decode()))
                user, _, secret = base64.b64decode(self.headers["Authorization"].split()[1]).decode().partition(":")
                owner.requests.append({"form": form, "user": user})
                ok = form.get("grant_type") == "client_credentials" and (user, secret) == (CLIENT_ID, CLIENT_SECRET)
                body = json.dumps({"access_token": KEY.sign(claims(sub=user)), "token_type": "Bearer",
                                   "expires_in": 3600} if ok else {"error": "invalid_client"}).encode()
                self.send_response(200 if ok else 401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/oauth2/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    d = tmp_path_factory.mktemp("client-security")
    ca, cert, key = make_certs(d)
    client_cert, client_key = make_client_cert(d, "alice")
    (d / "data").mkdir()
    ssl_port = free_port()
    idp = TokenEndpoint()
    b = SemelBroker(d / "data", log_path=d / "broker.log", extra_args=[
        "--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanisms", "OAUTHBEARER",
        "--oauthbearer-jwks", str(write_jwks(d / "jwks.json", KEY)), "--oauthbearer-expected-issuer", ISSUER,
        "--oauthbearer-expected-audience", AUDIENCE,
        "--listener", f"SSL://127.0.0.1:{ssl_port}", "--ssl-certfile", str(cert), "--ssl-keyfile", str(key),
        "--ssl-client-auth", "required", "--ssl-cafile", str(ca),
        "--super-user", f"User:{CLIENT_ID}", "--super-user", "User:CN=alice,OU=payments"])
    b.start()
    try:
        yield {"broker": b, "ssl": f"127.0.0.1:{ssl_port}", "ssl_port": ssl_port, "ca": ca,
               "cert": client_cert, "key": client_key, "idp": idp}
    finally:
        b.close()
        idp.close()


def test_pem_client_certificate_inline_and_from_a_file(env, tmp_path):
    inline = from_config({"security.protocol": "SSL", "ssl.truststore.type": "PEM",
                          "ssl.truststore.certificates": env["ca"].read_text(), "ssl.keystore.type": "PEM",
                          "ssl.keystore.certificate.chain": env["cert"].read_text(),
                          "ssl.keystore.key": env["key"].read_text()})
    with inline.connect(env["ssl"], "t", 10) as c:
        assert c.create_topic("pem-t", 2) == KafkaError.NONE
    both = tmp_path / "alice-both.pem"
    both.write_text(env["cert"].read_text() + env["key"].read_text())
    files = from_config({"security.protocol": "SSL", "ssl.truststore.location": str(env["ca"]),
                         "ssl.keystore.location": str(both)})
    with ClusterRouter(env["ssl"], timeout_s=10, security=files) as cluster:
        assert cluster.refresh()["pem-t"] == 2


def test_without_a_client_certificate_the_listener_refuses(env):
    no_cert = from_config({"security.protocol": "SSL", "ssl.truststore.location": str(env["ca"])})
    with pytest.raises(ReaderError, match="TLS"):
        ClusterRouter(env["ssl"], timeout_s=2, security=no_cert)


def test_host_name_check_and_its_opt_out(env):
    base = {"security.protocol": "SSL", "ssl.truststore.location": str(env["ca"]),
            "ssl.keystore.certificate.chain": env["cert"].read_text(), "ssl.keystore.key": env["key"].read_text()}
    # the broker's certificate names 127.0.0.1, not localhost
    with pytest.raises(ReaderError, match="not accepted"):
        ClusterRouter(f"localhost:{env['ssl_port']}", timeout_s=5, security=from_config(base), topics=[])
    off = from_config({**base, "ssl.endpoint.identification.algorithm": ""})
    with ClusterRouter(f"localhost:{env['ssl_port']}", timeout_s=10, security=off, topics=[]) as cluster:
        assert isinstance(cluster.refresh(), dict)


def oauth_config(url: str, secret: str) -> dict:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.token.endpoint.url": url,
            "sasl.login.callback.handler.class":
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
            "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                                f'clientId="{CLIENT_ID}" clientSecret="{secret}" scope="kafka";'}


def test_oauthbearer_token_from_the_endpoint(env):
    security = from_config(oauth_config(env["idp"].url, CLIENT_SECRET))
    before = len(env["idp"].requests)
    with ClusterRouter(env["broker"].bootstrap, timeout_s=10, security=security, topics=[]) as cluster:
        with security.connect(env["broker"].bootstrap, "t", 10) as c:   # a second connection, same token
            assert c.create_topic("oauth-t", 1) == KafkaError.NONE
        assert cluster.refresh()["oauth-t"] == 1
    asked = env["idp"].requests[before:]
    assert len(asked) == 1 and asked[0]["form"] == {"grant_type": "client_credentials", "scope": "kafka"}
    assert asked[0]["user"] == CLIENT_ID


def test_oauthbearer_refused_client_secret_is_one_line_without_it(env):
    with pytest.raises(ReaderError) as e:
        ClusterRouter(env["broker"].bootstrap, timeout_s=1,
                security=from_config(oauth_config(env["idp"].url, "wrong-secret-x")))
    assert "no token from" in str(e.value) and "401" in str(e.value)
    assert "wrong-secret-x" not in str(e.value) and "\n" not in str(e.value)
