"""Kafka's client security settings read into semel.client.security.Security: JAAS
parsing, every protocol and mechanism, PEM trust and keys, the refusals, and that no
secret shows in a repr, a pickle's repr or an error message."""
from __future__ import annotations

import base64
import json
import pickle
import ssl

import pytest

from semel.client.security import (OAuth, Secret, Security, SecurityError, Tls, from_config, parse_jaas)
from semel.spark import options as opt
from semel.spark.security import redacted

PW = "pa ss\"w;o=rd\\x"
SCRAM = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
         'username="alice" password="pa ss\\"w;o=rd\\\\x";')


def test_jaas_quoted_values_escapes_and_trailing_semicolon():
    module, opts = parse_jaas(SCRAM)
    assert module == "org.apache.kafka.common.security.scram.ScramLoginModule"
    assert opts == {"username": "alice", "password": PW}
    module, opts = parse_jaas("  a.b.PlainLoginModule   required\n username=bob  password = 'x y' ;  ")
    assert (module, opts) == ("a.b.PlainLoginModule", {"username": "bob", "password": "x y"})
    assert parse_jaas("M optional;") == ("M", {})


@pytest.mark.parametrize("text", [
    'M required username="a" password="secret-1"',         # no trailing ;
    'M required username="a" password="secret-1;',         # unclosed quote
    'M username="a" password="secret-1";',                 # no flag
    'M required username "secret-1";',                     # no =
    'M required username="a"; N required password="secret-1";',  # two modules
    'M required = "secret-1";',
])
def test_jaas_malformed_is_one_line_without_the_secret(text):
    with pytest.raises(SecurityError) as e:
        parse_jaas(text)
    assert "secret-1" not in str(e.value) and "\n" not in str(e.value)


def k(**kw) -> dict[str, str]:
    return {name.replace("_", "."): v for name, v in kw.items()}


def test_protocols_and_mechanisms():
    assert from_config({}) == Security()
    s = from_config({"security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": SCRAM})
    assert (s.protocol, s.mechanism, s.username, s.password.value) == ("SASL_SSL", "SCRAM-SHA-512", "alice", PW)
    assert s.tls == Tls() and s.sasl
    p = from_config({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                     "sasl.jaas.config": 'x.PlainLoginModule required username="u" password="p";'})
    assert p.tls is None and p.mechanism == "PLAIN"
    assert from_config({"security.protocol": "SSL"}).tls == Tls()


def test_oauthbearer_unsecured_and_endpoint():
    jaas = ('org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required '
            'unsecuredLoginStringClaim_sub="alice" unsecuredLoginListClaim_scope=",a,b" '
            'unsecuredLoginLifetimeSeconds="60";')
    s = from_config({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER", "sasl.jaas.config": jaas})
    assert s.oauth == OAuth(claims=(("scope", ("a", "b")), ("sub", "alice")), lifetime_s=60)
    head, body, sig = s.oauth.token().split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    assert sig == "" and json.loads(base64.urlsafe_b64decode(head + "==")) == {"alg": "none"}
    assert claims["sub"] == "alice" and claims["scope"] == ["a", "b"] and claims["exp"] - claims["iat"] == 60
    e = from_config({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
                     "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
                     "sasl.login.callback.handler.class":
                         "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
                     "sasl.jaas.config": 'x.OAuthBearerLoginModule required clientId="c" clientSecret="top-secret" '
                                         'scope="kafka";'})
    assert (e.oauth.endpoint, e.oauth.client_id, e.oauth.client_secret.value, e.oauth.scope) == \
        ("https://idp/token", "c", "top-secret", "kafka")
    assert "top-secret" not in repr(e)


@pytest.mark.parametrize("config,says", [
    ({"security.protocol": "SASL_SSLX"}, "security.protocol"),
    ({"security.protocol": "SASL_SSL", "sasl.jaas.config": SCRAM}, "GSSAPI is not supported"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}, "sasl.jaas.config' is required"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.jaas.config": SCRAM}, "takes PlainLoginModule"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
      "sasl.jaas.config": 'x.ScramLoginModule required password="pa ss\\"w;o=rd\\\\x";'}, "needs username"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
      "sasl.jaas.config": 'x.OAuthBearerLoginModule required;'}, "unsecuredLoginStringClaim_sub"),
    ({"security.protocol": "SSL", "ssl.truststore.type": "JKS", "ssl.truststore.location": "/x.jks",
      "ssl.truststore.password": PW}, "JKS stores are not supported, only PEM"),
    ({"security.protocol": "SSL", "ssl.keystore.type": "PKCS12"}, "PKCS12 stores are not supported"),
    ({"security.protocol": "SSL", "ssl.truststore.type": "PEM", "ssl.truststore.password": PW}, "PEM one has none"),
    ({"security.protocol": "SSL", "ssl.keystore.certificate.chain": "x"}, "go together"),
    ({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "http"}, "https or empty"),
    ({"security.protocol": "SSL", "ssl.enabled.protocols": "TLSv1.1"}, "not supported"),
])
def test_refusals_name_the_option_and_hide_secrets(config, says):
    with pytest.raises(SecurityError) as e:
        from_config(config)
    assert says in str(e.value)
    assert PW not in str(e.value) and "\n" not in str(e.value)


def test_a_store_that_is_not_pem_is_refused_without_a_type(tmp_path):
    jks = tmp_path / "trust.jks"
    jks.write_bytes(b"\xfe\xed\xfe\xed\x00\x00\x00\x02binary")
    with pytest.raises(SecurityError, match="is not PEM"):
        from_config({"security.protocol": "SSL", "ssl.truststore.location": str(jks)})


def test_pem_trust_and_client_certificate(tmp_path):
    from semel.testing.certs import make_certs, make_client_cert
    ca, _, _ = make_certs(tmp_path)
    cert, key = make_client_cert(tmp_path, "alice")
    inline = from_config({"security.protocol": "SSL", "ssl.truststore.type": "PEM",
                          "ssl.truststore.certificates": ca.read_text(), "ssl.keystore.type": "PEM",
                          "ssl.keystore.certificate.chain": cert.read_text(), "ssl.keystore.key": key.read_text(),
                          "ssl.endpoint.identification.algorithm": ""})
    ctx = inline.tls.context()
    assert isinstance(ctx, ssl.SSLContext) and not ctx.check_hostname
    assert ctx.verify_mode == ssl.CERT_REQUIRED and len(ctx.get_ca_certs()) == 1
    assert key.read_text() not in repr(inline)
    both = tmp_path / "both.pem"
    both.write_text(cert.read_text() + key.read_text())
    files = from_config({"security.protocol": "SSL", "ssl.truststore.location": str(ca),
                         "ssl.keystore.location": str(both), "ssl.enabled.protocols": "TLSv1.3"})
    ctx = files.tls.context()
    assert ctx.check_hostname and ctx.minimum_version == ssl.TLSVersion.TLSv1_3
    wrong = from_config({"security.protocol": "SSL", "ssl.keystore.type": "PEM",
                         "ssl.keystore.location": str(cert)})   # a chain without its key
    with pytest.raises(SecurityError, match="could not be loaded"):
        wrong.tls.context()


def test_secrets_never_shown():
    s = from_config({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256", "sasl.jaas.config": SCRAM})
    for text in (repr(s), str(s), f"{s}", repr(pickle.loads(pickle.dumps(s)))):
        assert PW not in text and "pa ss" not in text
    assert pickle.loads(pickle.dumps(s)) == s and hash(pickle.loads(pickle.dumps(s))) == hash(s)
    assert str(Secret("x")) == "Secret(***)"
    given = {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "kafka.security.protocol": "SASL_SSL",
             "kafka.sasl.mechanism": "SCRAM-SHA-256", "kafka.sasl.jaas.config": SCRAM}
    parsed = opt.parse_source(given, batch=False)
    assert parsed.security == s
    assert PW not in repr(parsed) and "pa ss" not in repr(parsed)
    assert SCRAM not in str(redacted(given)) and redacted(given)["subscribe"] == "t"


def test_spark_options_accept_every_security_name_and_wrap_errors():
    from semel.spark.sink import SinkError, parse_options
    base = {"kafka.bootstrap.servers": "h:1", "checkpointLocation": "/ck", "topic": "out"}
    o = parse_options({**base, "kafka.security.protocol": "SSL", "kafka.ssl.endpoint.identification.algorithm": ""})
    assert o.security.tls == Tls(check_hostname=False)
    with pytest.raises(SinkError, match="kafka.sasl.mechanism"):
        parse_options({**base, "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "GSSAPI",
                       "kafka.sasl.jaas.config": SCRAM})
    with pytest.raises(opt.OptionError, match="kafka.ssl.truststore.type"):
        opt.parse_source({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "kafka.security.protocol": "SSL",
                          "kafka.ssl.truststore.type": "JKS"}, batch=True)
    with pytest.raises(opt.OptionError, match="unknown"):
        opt.parse_source({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "kafka.ssl.trustore.type": "PEM"},
                         batch=True)
