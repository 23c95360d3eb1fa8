"""AlterUserScramCredentials' rules as pure functions: the credential kept for a salted
password is the one a SCRAM login checks, and Kafka's per-user all-or-nothing checks."""
import hashlib
from types import SimpleNamespace as NS

import pytest
import scramp

from semel.broker.auth.users import _b64, altered, credential_from_salted
from semel.broker.handlers.user_scram import plan
from semel.protocol.errors import KafkaError as E


@pytest.mark.parametrize("mechanism,hash_name", [("SCRAM-SHA-256", "sha256"), ("SCRAM-SHA-512", "sha512")])
def test_credential_from_a_salted_password_is_scramps(mechanism, hash_name):
    salt = b"0123456789abcdef"
    salted = hashlib.pbkdf2_hmac(hash_name, b"pw", salt, 8192)
    _, stored, server, _ = scramp.ScramMechanism(mechanism).make_auth_info("pw", iteration_count=8192, salt=salt)
    assert credential_from_salted(mechanism, salt, salted, 8192) == {
        "salt": _b64(salt), "stored_key": _b64(stored), "server_key": _b64(server), "iterations": 8192}


def up(name, mechanism=1, iterations=4096):
    return NS(name=name, mechanism=mechanism, iterations=iterations, salt=b"s" * 16, salted_password=b"p" * 32)


def test_each_user_all_or_nothing_with_kafkas_codes():
    changes, errors = plan(
        [NS(name="dup", mechanism=1), NS(name="gone", mechanism=2)],
        [up("ok"), up("ok", mechanism=2), up("dup"), up("", 1), up("odd", mechanism=3), up("few", iterations=10),
         up("many", iterations=16385), up("few", mechanism=2)])
    assert {n: e[0] for n, e in errors.items()} == {
        "dup": E.DUPLICATE_RESOURCE, "": E.UNACCEPTABLE_CREDENTIAL, "odd": E.UNSUPPORTED_SASL_MECHANISM,
        "few": E.UNACCEPTABLE_CREDENTIAL, "many": E.UNACCEPTABLE_CREDENTIAL}
    assert sorted(changes) == ["gone", "ok"]                      # "few"'s good entry is not applied either
    assert sorted(changes["ok"][0]) == ["SCRAM-SHA-256", "SCRAM-SHA-512"] and changes["gone"] == ({}, {"SCRAM-SHA-512"})


def test_altered_refuses_deleting_what_is_not_there_and_drops_an_empty_user():
    cred = {"SCRAM-SHA-256": {"iterations": 4096}}
    assert altered(cred, {}, {"SCRAM-SHA-512"})[1] is not None
    assert altered(cred, {}, {"SCRAM-SHA-256"}) == (None, None)
    assert altered(None, {"SCRAM-SHA-512": 1}, set()) == ({"SCRAM-SHA-512": 1}, None)
