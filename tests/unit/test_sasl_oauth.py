"""OAUTHBEARER's unsecured-token rules (Kafka's OAuthBearerUnsecuredJws and validation
utilities) and the SASL session's re-authentication transitions (KIP-368)."""
from __future__ import annotations

import base64
import json
import time

import pytest

from semel.broker.auth import oauth
from semel.broker.auth.oauth import (MalformedResponse, TokenRefused, ValidatorConfig, initial_response,
                                     parse_initial_response, unsecured_token, validate_unsecured)
from semel.broker.auth.sasl import AuthFailed, IllegalState, SaslSession, SaslSettings, State
from semel.broker.auth.sasl import TokenRefused as ChallengeRefusal
from semel.broker.auth.users import UserStore

NOW_MS = 1_800_000_000_000
NOW = NOW_MS / 1000


def claims(**over):
    return {"sub": "alice", "iat": NOW - 10, "exp": NOW + 60, **over}


def b64(doc) -> str:
    raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_valid_token_gives_principal_expiry_and_scope():
    t = validate_unsecured(unsecured_token(claims(scope="read write", exp=NOW + 60.5)), ValidatorConfig(), NOW_MS)
    assert t == oauth.Token("alice", NOW_MS + 60_500, frozenset({"read", "write"}))
    t = validate_unsecured(unsecured_token(claims(scope=["a", "b"])), ValidatorConfig(), NOW_MS)
    assert t.scope == frozenset({"a", "b"})


@pytest.mark.parametrize("compact,why", [
    (f"{b64({'alg': 'none'})}.{b64(claims())}", "3 dot-separated"),
    (f"{b64({'alg': 'none'})}.{b64(claims())}.c2ln", "empty signature"),
    (f"{b64({'alg': 'HS256'})}.{b64(claims())}.", "alg 'none'"),
    (f"{b64(b'not json')}.{b64(claims())}.", "header is not"),
    (f"{b64({'alg': 'none'})}.{b64([1, 2])}.", "payload is not a JSON object"),
    (f"{b64({'alg': 'none'})}.***.", "payload is not"),
])
def test_malformed_jws_is_refused(compact, why):
    with pytest.raises(TokenRefused, match=why) as refused:
        validate_unsecured(compact, ValidatorConfig(), NOW_MS)
    assert json.loads(refused.value.challenge()) == {"status": "invalid_token"}


@pytest.mark.parametrize("over,why", [
    ({"sub": ""}, "'sub'"), ({"sub": None}, "'sub'"), ({"exp": None}, "'exp' is missing"),
    ({"exp": True}, "'exp' is not a number"), ({"iat": "x"}, "'iat' is not a number"),
    ({"exp": NOW}, "expired"), ({"iat": NOW + 1}, "not valid yet"),
    ({"iat": NOW - 5, "exp": NOW - 5}, "expired"), ({"scope": 3}, "'scope'"),
])
def test_claims_are_checked(over, why):
    with pytest.raises(TokenRefused, match=why):
        validate_unsecured(unsecured_token(claims(**over)), ValidatorConfig(), NOW_MS)


def test_exp_must_follow_iat():
    with pytest.raises(TokenRefused, match="not after its issued-at"):
        validate_unsecured(unsecured_token(claims(iat=NOW + 30, exp=NOW + 30)),
                           ValidatorConfig(allowable_clock_skew_ms=60_000), NOW_MS)


def test_clock_skew_widens_both_ends_exactly():
    cfg = ValidatorConfig(allowable_clock_skew_ms=2000)
    validate_unsecured(unsecured_token(claims(exp=NOW - 1.999)), cfg, NOW_MS)
    validate_unsecured(unsecured_token(claims(iat=NOW + 2)), cfg, NOW_MS)
    with pytest.raises(TokenRefused, match="expired"):
        validate_unsecured(unsecured_token(claims(exp=NOW - 2)), cfg, NOW_MS)
    with pytest.raises(TokenRefused, match="not valid yet"):
        validate_unsecured(unsecured_token(claims(iat=NOW + 2.001)), cfg, NOW_MS)


def test_required_scope_and_claim_names():
    cfg = ValidatorConfig(principal_claim="client_id", scope_claim="scp", required_scope=("pay", "read"))
    t = validate_unsecured(unsecured_token(claims(client_id="svc", scp="read pay extra")), cfg, NOW_MS)
    assert t.principal == "svc"
    with pytest.raises(TokenRefused) as refused:
        validate_unsecured(unsecured_token(claims(client_id="svc", scp="read")), cfg, NOW_MS)
    assert json.loads(refused.value.challenge()) == {"status": "insufficient_scope", "scope": "pay read"}


def test_initial_response_round_trip_with_authzid_and_extensions():
    msg = initial_response("a.b.", authzid="we,ird=name", traceId="t-1")
    assert msg == b"n,a=we=2Cird=3Dname,\x01auth=Bearer a.b.\x01traceId=t-1\x01\x01"
    assert parse_initial_response(msg) == ("we,ird=name", "a.b.")
    assert parse_initial_response(b"n,,\x01auth=bearer x.y.\x01\x01") == (None, "x.y.")


@pytest.mark.parametrize("msg", [
    b"", b"\xff", b"n,,\x01\x01", b"n,,\x01auth=Bearer\x01\x01", b"n,,\x01auth=Bearer a b\x01\x01",
    b"p=tls,,\x01auth=Bearer a.b.\x01\x01", b"n,,\x01auth=Bearer a.b.\x01", b"n,a=,\x01auth=Bearer a.b.\x01\x01",
    b"n,,\x01auth=Bearer a.b.\x0112=x\x01\x01",
])
def test_malformed_initial_responses(msg):
    with pytest.raises(MalformedResponse):
        parse_initial_response(msg)


# --- the session: OAUTHBEARER exchange and re-authentication -----------------------

def session(tmp_path, max_reauth_ms=0, mechanisms=("PLAIN", "OAUTHBEARER")):
    users = UserStore(tmp_path)
    if not users.names():
        users.add("alice", "pw")
        users.add("bob", "pw")
    return SaslSession(users, SaslSettings(mechanisms, max_reauth_ms))


def plain(s, user, pw="pw"):
    s.handshake("PLAIN")
    return s.authenticate(f"\0{user}\0{pw}".encode())


def test_refused_token_then_any_message_fails_once(tmp_path):
    s = session(tmp_path)
    s.handshake("OAUTHBEARER")
    with pytest.raises(ChallengeRefusal) as refusal:
        s.authenticate(initial_response(unsecured_token({"sub": "alice", "exp": time.time() - 60})))
    assert json.loads(refusal.value.challenge) == {"status": "invalid_token"} and s.state is State.OAUTH_REFUSED
    with pytest.raises(AuthFailed) as failed:
        s.authenticate(b"\x01")
    assert failed.value.counted and "expired" in str(failed.value) and s.state is State.FAILED


def test_lifetime_is_reauth_limit_or_token_expiry_whichever_first(tmp_path):
    s = session(tmp_path, max_reauth_ms=60_000)
    s.handshake("OAUTHBEARER")
    s.authenticate(initial_response(unsecured_token({"sub": "alice", "exp": time.time() + 10})))
    # exp rounds to the millisecond, now is truncated to it: 10 s plus at most 1 ms
    assert s.principal == "User:alice" and 9_000 < s.lifetime_ms <= 10_001
    s = session(tmp_path, max_reauth_ms=5_000)
    plain(s, "alice")
    assert s.lifetime_ms == 5_000 and not s.expired(time.monotonic())
    assert s.expired(time.monotonic() + 5.001)
    s = session(tmp_path)   # re-authentication off: tokens are not enforced after the login
    s.handshake("OAUTHBEARER")
    s.authenticate(initial_response(unsecured_token({"sub": "alice", "exp": time.time() + 10})))
    assert s.lifetime_ms == 0 and not s.expired(time.monotonic() + 3600)


def test_reauthentication_renews_and_keeps_the_principal(tmp_path):
    s = session(tmp_path, max_reauth_ms=5_000)
    plain(s, "alice")
    first = s.expires_at
    time.sleep(0.01)
    plain(s, "alice")
    assert s.state is State.AUTHENTICATED and s.logins == 2 and s.expires_at > first and s.previous is None


def test_reauthentication_with_other_principal_or_mechanism_fails(tmp_path):
    s = session(tmp_path, max_reauth_ms=5_000)
    plain(s, "alice")
    with pytest.raises(AuthFailed, match="Cannot change principals"):
        plain(s, "bob")
    assert s.state is State.FAILED
    s = session(tmp_path, max_reauth_ms=5_000)
    plain(s, "alice")
    with pytest.raises(LookupError):
        s.handshake("OAUTHBEARER")
    assert s.state is State.FAILED


def test_second_handshake_without_reauthentication_is_illegal(tmp_path):
    s = session(tmp_path)   # connections.max.reauth.ms 0: Kafka answers ILLEGAL_SASL_STATE
    plain(s, "alice")
    with pytest.raises(IllegalState):
        s.handshake("PLAIN")


def test_deleted_user_fails_the_reauthentication(tmp_path):
    s = session(tmp_path, max_reauth_ms=5_000)
    plain(s, "alice")
    s.users.delete("alice")
    with pytest.raises(AuthFailed):
        plain(s, "alice")
    assert s.state is State.FAILED and s.principal is None


# --- property: what a client writes, the broker reads back ------------------------

from hypothesis import given, strategies as st  # noqa: E402

_ascii = st.text(st.characters(min_codepoint=0x02, max_codepoint=0x7F), min_size=1, max_size=20)
_ext_value = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=20)


@given(authzid=st.one_of(st.none(), _ascii),
       extensions=st.dictionaries(st.from_regex(r"[A-Za-z]{1,8}", fullmatch=True).filter(lambda k: k != "auth"),
                                  _ext_value, max_size=3),
       sub=st.text(min_size=1, max_size=30).filter(str.strip), life_s=st.floats(0.002, 1e6))
def test_any_well_formed_response_round_trips_and_validates(authzid, extensions, sub, life_s):
    compact = unsecured_token({"sub": sub, "iat": NOW, "exp": NOW + life_s})
    assert parse_initial_response(initial_response(compact, authzid, **extensions)) == (authzid, compact)
    t = validate_unsecured(compact, ValidatorConfig(), NOW_MS)
    assert t.principal == sub and t.expires_ms == int(round((NOW + life_s) * 1000))
