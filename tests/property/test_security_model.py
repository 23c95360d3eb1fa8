"""Model checks of the security layer without a broker: the SASL exchange's state
machine (hypothesis stateful, invariants after every step) and the authorizer's
decision against a direct reading of Kafka's rules on random ACL sets."""
from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import scramp
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from semel.broker.auth.acl import (MAX_CACHED_DECISIONS, AclBinding, AclFilter, AclStore, Authorizer, Operation,
                                   PatternType, Permission, ResourceType)
from semel.broker.auth.sasl import AuthFailed, IllegalState, SaslSession, SaslSettings, State
from semel.broker.auth.users import UserStore

_DIR = Path(tempfile.mkdtemp(prefix="semel-sasl-model-"))
USERS = UserStore(_DIR)
USERS.add("ann", "ann-pw")
USERS.add("bob", "bob-pw")
VALID = {("ann", "ann-pw"), ("bob", "bob-pw")}
MECHS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
REAUTH_MS = 60_000


class SaslModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.s = SaslSession(USERS, SaslSettings(MECHS, REAUTH_MS))
        self.failed = False           # model: once failed, nothing succeeds again
        self.proved: str | None = None
        self.reauth_of: str | None = None   # model: the user a re-login (KIP-368) must prove again
        self.client = None
        self.client_creds: tuple[str, str] | None = None   # SCRAM: who began the exchange

    def _expect_illegal(self, fn) -> None:
        try:
            fn()
        except IllegalState:
            return
        except AuthFailed:
            pass
        raise AssertionError(f"allowed in state {self.s.state}")

    @rule(mech=st.sampled_from(MECHS + ("GSSAPI", "")))
    def handshake(self, mech):
        if self.s.state not in (State.START, State.AUTHENTICATED):
            return self._expect_illegal(lambda: self.s.handshake(mech))
        reauth, before = self.s.state is State.AUTHENTICATED, self.s.mechanism
        try:
            self.s.handshake(mech)
        except LookupError:
            assert mech not in MECHS or (reauth and mech != before)
            self.failed = True
            return
        assert mech in MECHS and (not reauth or mech == before)
        if reauth:
            self.reauth_of = self.proved

    @rule(user=st.sampled_from(["ann", "bob", "cid"]), pw=st.sampled_from(["ann-pw", "bob-pw", "nope"]),
          junk=st.binary(max_size=12))
    def authenticate(self, user, pw, junk):
        state = self.s.state
        if state not in (State.MECHANISM, State.SCRAM_CHALLENGED):
            return self._expect_illegal(lambda: self.s.authenticate(junk))
        if self.s.mechanism == "PLAIN":
            token = f"\0{user}\0{pw}".encode()
        elif state is State.MECHANISM:
            self.client = scramp.ScramClient([self.s.mechanism], user, pw)
            self.client_creds = (user, pw)
            token = self.client.get_client_first().encode()
        else:   # SCRAM's final message proves the credentials its first message began with
            user, pw = self.client_creds
            token = self.client.get_client_final().encode()
        try:
            out = self.s.authenticate(token)
        except AuthFailed:
            self.failed = True
            # only wrong credentials, or a re-login as someone else, fail
            assert (user, pw) not in VALID or self.reauth_of not in (None, user)
            return
        if self.s.mechanism != "PLAIN" and state is State.MECHANISM:
            self.client.set_server_first(out.decode())
        if self.s.state is State.AUTHENTICATED:
            assert (user, pw) in VALID and self.reauth_of in (None, user)
            self.proved, self.reauth_of = self.s.user, None

    @invariant()
    def consistent(self):
        assert (self.s.principal is not None) == (self.s.state is State.AUTHENTICATED)
        if self.failed:
            assert self.s.state is State.FAILED and self.s.principal is None
        if self.s.principal is not None:
            assert self.s.principal == f"User:{self.proved}" and self.proved in ("ann", "bob")
            assert self.s.lifetime_ms == REAUTH_MS and self.s.expires_at is not None
        if self.reauth_of is not None and not self.failed:   # mid re-login: the old login is kept
            assert self.s.previous == (f"User:{self.reauth_of}", self.s.mechanism)


TestSaslModel = SaslModel.TestCase
TestSaslModel.settings = settings(max_examples=60, stateful_step_count=8, deadline=None,
                                  suppress_health_check=[HealthCheck.too_slow])

NAMES = ["pay", "payments", "payroll", "other", "*"]
PRINCIPALS = ["User:ann", "User:bob", "User:*"]
OPS = [Operation.READ, Operation.WRITE, Operation.DESCRIBE, Operation.ALL, Operation.ALTER]
bindings = st.builds(AclBinding, st.just(ResourceType.TOPIC), st.sampled_from(NAMES),
                     st.sampled_from([PatternType.LITERAL, PatternType.PREFIXED]), st.sampled_from(PRINCIPALS),
                     st.sampled_from(["*", "10.0.0.1"]), st.sampled_from(OPS),
                     st.sampled_from([Permission.ALLOW, Permission.DENY]))


def reference(acls, principal, host, op, name, allow_if_none) -> bool:
    def on_resource(b):
        if b.pattern is PatternType.LITERAL:
            return b.name in (name, "*")
        return name.startswith(b.name)
    matching = [b for b in acls if on_resource(b)]
    if not matching:
        return allow_if_none
    mine = [b for b in matching if b.principal in (principal, "User:*") and b.host in (host, "*")]
    if any(b.permission is Permission.DENY and b.operation in (op, Operation.ALL) for b in mine):
        return False
    implied = {op, Operation.ALL}
    if op is Operation.DESCRIBE:
        implied |= {Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}
    return any(b.permission is Permission.ALLOW and b.operation in implied for b in mine)


@settings(max_examples=200, deadline=None)
@given(acls=st.lists(bindings, max_size=6), principal=st.sampled_from(["User:ann", "User:bob", "User:root"]),
       host=st.sampled_from(["10.0.0.1", "10.0.0.2"]), op=st.sampled_from(OPS[:3] + [Operation.ALTER]),
       name=st.sampled_from(["pay", "payments", "other", "x"]), allow_if_none=st.booleans())
def test_authorizer_follows_kafkas_rules(acls, principal, host, op, name, allow_if_none):
    store = AclStore(Path(tempfile.mkdtemp(dir=_DIR)))
    store.add(acls)
    auth = Authorizer(store, True, {"User:root"}, allow_if_none)
    got = auth.authorize(principal, host, op, ResourceType.TOPIC, name)
    if principal == "User:root":
        assert got
    else:
        assert got == reference(set(acls), principal, host, op, name, allow_if_none)
    # deny wins: a matching DENY for this principal always refuses
    auth.allow_if_no_acl = True
    store.add([AclBinding(ResourceType.TOPIC, name, PatternType.LITERAL, principal, "*", op, Permission.DENY)])
    assert auth.authorize(principal, host, op, ResourceType.TOPIC, name) == (principal == "User:root")


class CachedAuthorizerModel(RuleBasedStateMachine):
    """The authorizer caches its decisions per version of the ACL file: ACLs added and
    removed between queries (as `semel acl` does while the broker runs) and a changed
    allow-if-no-acl must show in the very next decision. Checked against the reference
    reading of the current ACL set after every step."""

    def __init__(self):
        super().__init__()
        self.store = AclStore(Path(tempfile.mkdtemp(dir=_DIR)))
        self.auth = Authorizer(self.store, True, {"User:root"}, False)
        self.acls: set[AclBinding] = set()

    @rule(b=bindings)
    def add(self, b):
        self.store.add([b])
        self.acls.add(b)

    @rule(data=st.data())
    def remove(self, data):
        if not self.acls:
            return
        b = data.draw(st.sampled_from(sorted(self.acls, key=repr)))
        gone = self.store.remove(AclFilter(b.resource_type, b.name, b.pattern, b.principal, b.host, b.operation,
                                           b.permission))
        assert gone == [b]
        self.acls.discard(b)

    @rule()
    def toggle_allow_if_no_acl(self):
        self.auth.allow_if_no_acl = not self.auth.allow_if_no_acl

    @invariant()
    def every_decision_current(self):
        # Every question of the small universe, so a stale cached answer is always asked
        # again; asked twice, the second answer comes from the cache.
        for principal, host, op, name in itertools.product(
                ["User:ann", "User:bob"], ["10.0.0.1", "10.0.0.2"], OPS[:3] + [Operation.ALTER],
                ["pay", "payments", "other"]):
            want = reference(self.acls, principal, host, op, name, self.auth.allow_if_no_acl)
            for _ in range(2):
                assert self.auth.authorize(principal, host, op, ResourceType.TOPIC, name) == want

    @invariant()
    def cache_bounded(self):
        assert len(self.auth._decisions) <= MAX_CACHED_DECISIONS


TestCachedAuthorizerModel = CachedAuthorizerModel.TestCase
TestCachedAuthorizerModel.settings = settings(max_examples=40, stateful_step_count=15, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
