"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51): SASL/SCRAM users
over the wire (KIP-554), as Kafka's admin tools and confluent-kafka's AdminClient manage
them. The client sends the salted password, never the password; the broker keeps the
stored and server keys derived from it. On a single node they change the data dir's user
file, in a cluster the users in etcd, which every broker follows. Who may call them
(Alter / Describe on the cluster) is checked in auth_gate.py."""
from __future__ import annotations

from typing import Any

from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ..auth.users import ITERATIONS, MAX_ITERATIONS, MECHANISM_CODES, credential_from_salted
from ..router import RequestContext, handler

_CODE_OF = {name: code for code, name in MECHANISM_CODES.items()}


def plan(deletions: Any, upsertions: Any) -> tuple[dict[str, tuple[dict[str, Any], set[str]]], dict[str, tuple[KafkaError, str]]]:
    """Kafka's checks, per user: (changes of the users whose entries all pass, the error of
    each other user). A user with one bad entry changes nothing."""
    names: list[str] = []
    changes: dict[str, tuple[dict[str, Any], set[str]]] = {}
    errors: dict[str, tuple[KafkaError, str]] = {}
    seen: set[tuple[str, int]] = set()
    entries = [(d, None) for d in deletions] + [(u, u) for u in upsertions]
    for entry, upsert in entries:
        name = entry.name or ""
        if name not in names:
            names.append(name)
        err = _check(entry, upsert, seen)
        seen.add((name, entry.mechanism))
        if err is not None:
            errors.setdefault(name, err)
            continue
        upserts, deletes = changes.setdefault(name, ({}, set()))
        mech = MECHANISM_CODES[entry.mechanism]
        if upsert is None:
            deletes.add(mech)
        else:
            upserts[mech] = credential_from_salted(mech, upsert.salt, upsert.salted_password, upsert.iterations)
    return {n: c for n, c in changes.items() if n not in errors}, errors


def _check(entry: Any, upsert: Any, seen: set[tuple[str, int]]) -> tuple[KafkaError, str] | None:
    if not entry.name:
        return KafkaError.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
    if entry.mechanism not in MECHANISM_CODES:
        return KafkaError.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"
    if (entry.name, entry.mechanism) in seen:
        return KafkaError.DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request"
    if upsert is not None:
        if upsert.iterations < ITERATIONS:
            return KafkaError.UNACCEPTABLE_CREDENTIAL, f"Too few iterations (at least {ITERATIONS})"
        if upsert.iterations > MAX_ITERATIONS:
            return KafkaError.UNACCEPTABLE_CREDENTIAL, f"Too many iterations (at most {MAX_ITERATIONS})"
        if not upsert.salt or not upsert.salted_password:
            return KafkaError.UNACCEPTABLE_CREDENTIAL, "Salt and salted password must not be empty"
    return None


@handler(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, 0)
async def alter_user_scram_credentials(ctx: RequestContext, body: Any) -> Any:
    R = ctx.cls().AlterUserScramCredentialsResult
    changes, errors = plan(body.deletions or [], body.upsertions or [])
    try:
        refused = await ctx.services.users.alter(changes) if changes else {}
    except ConnectionError as exc:   # a cluster's etcd unreachable
        refused = {}
        errors.update({n: (KafkaError.UNKNOWN_SERVER_ERROR, f"metadata service: {exc}") for n in changes})
    for name, message in refused.items():
        if message is not None:
            errors[name] = (KafkaError.RESOURCE_NOT_FOUND, message)
    names = list(dict.fromkeys([e.name or "" for e in [*(body.deletions or []), *(body.upsertions or [])]]))
    return ctx.response(throttle_time_ms=0, results=[
        R(user=n, error_code=errors.get(n, (KafkaError.NONE, None))[0], error_message=errors.get(n, (0, None))[1])
        for n in names])


@handler(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, 0)
async def describe_user_scram_credentials(ctx: RequestContext, body: Any) -> Any:
    cls = ctx.cls()
    R = cls.DescribeUserScramCredentialsResult
    C = R.CredentialInfo
    users = ctx.services.users.credentials()
    asked = [u.name for u in body.users] if body.users else sorted(users)
    results = []
    for i, name in enumerate(asked):
        if name in asked[:i]:
            results.append(R(user=name, error_code=KafkaError.DUPLICATE_RESOURCE, credential_infos=[],
                             error_message="Cannot describe SCRAM credentials for the same user twice in a single request"))
        elif name not in users:
            results.append(R(user=name, error_code=KafkaError.RESOURCE_NOT_FOUND, credential_infos=[],
                             error_message="Attempt to describe a user credential that does not exist"))
        else:
            results.append(R(user=name, error_code=KafkaError.NONE, error_message=None, credential_infos=[
                C(mechanism=_CODE_OF[m], iterations=cred["iterations"]) for m, cred in sorted(users[name].items())]))
    return ctx.response(throttle_time_ms=0, error_code=KafkaError.NONE, error_message=None, results=results)
