"""SCRAM credentials, never passwords: per user and mechanism the salt, stored key,
server key and iteration count (RFC 5802), as Kafka keeps them. PLAIN logins are
checked against the same salted hash."""
from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path
from typing import Any, Iterable, TypedDict

import scramp

from .store import JsonStore

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
ITERATIONS = 4096   # Kafka's minimum for SCRAM credentials
MAX_ITERATIONS = 16384   # and its maximum (AlterUserScramCredentials refuses more)
# AlterUserScramCredentials / DescribeUserScramCredentials name mechanisms by number.
MECHANISM_CODES = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
_HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}
FILE_NAME = "__users.json"


class Credential(TypedDict):
    """One mechanism's salted credential as stored (the keys base64)."""
    salt: str
    stored_key: str
    server_key: str
    iterations: int


# {mechanism: credential} of one user; {user: that} of a store
Credentials = dict[str, Credential]
Users = dict[str, Credentials]
# (salt, stored_key, server_key, iterations), as scramp takes them
AuthInfo = tuple[bytes, bytes, bytes, int]


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _unb64(s: str) -> bytes:
    return base64.b64decode(s)


def _check_users(doc: Any) -> None:
    for creds in doc.values():
        for cred in creds.values():
            _unb64(cred["salt"]), _unb64(cred["stored_key"]), _unb64(cred["server_key"]), int(cred["iterations"])


def make_credentials(name: str, password: str, mechanisms: Iterable[str] = MECHANISMS) -> Credentials:
    """{mechanism: salted credential} for a new password: what every user store keeps."""
    if not name or not password:
        raise ValueError("user name and password must not be empty")
    creds: Credentials = {}
    for mech in mechanisms:
        if mech not in MECHANISMS:
            raise ValueError(f"unknown mechanism {mech!r} (known: {', '.join(MECHANISMS)})")
        salt, stored, server, iters = scramp.ScramMechanism(mech).make_auth_info(
            password, iteration_count=ITERATIONS)
        creds[mech] = {"salt": _b64(salt), "stored_key": _b64(stored), "server_key": _b64(server),
                       "iterations": iters}
    return creds


def credential_from_salted(mechanism: str, salt: bytes, salted_password: bytes, iterations: int) -> Credential:
    """The stored credential for a password a client salted itself (RFC 5802:
    StoredKey = H(HMAC(SaltedPassword, "Client Key")), ServerKey = HMAC(SaltedPassword,
    "Server Key")): what AlterUserScramCredentials carries, never the password."""
    h = _HASHES[mechanism]
    client_key = hmac.new(salted_password, b"Client Key", h).digest()
    return {"salt": _b64(salt), "stored_key": _b64(h(client_key).digest()),
            "server_key": _b64(hmac.new(salted_password, b"Server Key", h).digest()), "iterations": iterations}


def altered(current: Credentials | None, upserts: Credentials, deletes: set[str]) -> tuple[Credentials | None, str | None]:
    """A user's credentials after deleting the mechanisms `deletes` and setting `upserts`
    (None: no credential left, the user is gone), or an error message when a deleted
    mechanism was not there (Kafka's RESOURCE_NOT_FOUND)."""
    current = dict(current or {})
    if any(mech not in current for mech in deletes):
        return None, "Attempt to delete a user credential that does not exist"
    for mech in deletes:
        del current[mech]
    current.update(upserts)
    return current or None, None


class CredentialReader:
    """Logins checked against {user: {mechanism: credential}} as `_users()` gives it
    (a file under the data dir here, etcd in a cluster: semel.broker.auth.cluster_store)."""

    def _users(self) -> Users:
        raise NotImplementedError

    def names(self) -> dict[str, list[str]]:
        return {name: sorted(creds) for name, creds in sorted(self._users().items())}

    def auth_info(self, name: str, mechanism: str) -> AuthInfo | None:
        """(salt, stored_key, server_key, iterations) for scramp, or None."""
        cred = self._users().get(name, {}).get(mechanism)
        if cred is None:
            return None
        return (_unb64(cred["salt"]), _unb64(cred["stored_key"]), _unb64(cred["server_key"]),
                cred["iterations"])

    def check_password(self, name: str, password: str) -> bool:
        """PLAIN: salt the offered password the way the stored credential was made."""
        for mech in MECHANISMS:
            info = self.auth_info(name, mech)
            if info is None:
                continue
            salt, stored, _, iters = info
            _, offered, _, _ = scramp.ScramMechanism(mech).make_auth_info(
                password, iteration_count=iters, salt=salt)
            return hmac.compare_digest(offered, stored)
        return False


class UserStore(CredentialReader):
    def __init__(self, data_dir: Path):
        self.store = JsonStore(Path(data_dir) / FILE_NAME, dict, check=_check_users)

    def _users(self) -> Users:
        users: Users = self.store.read()
        return users

    def add(self, name: str, password: str, mechanisms: Iterable[str] = MECHANISMS) -> None:
        creds = make_credentials(name, password, mechanisms)
        with self.store.update() as doc:
            doc[name] = creds

    def delete(self, name: str) -> bool:
        with self.store.update() as doc:
            return doc.pop(name, None) is not None

    async def alter(self, changes: dict[str, tuple[Credentials, set[str]]]) -> dict[str, str | None]:
        """AlterUserScramCredentials: per user (upserts, deletes), applied together;
        per user None or the error message of a change that was refused."""
        out: dict[str, str | None] = {}
        with self.store.update() as doc:
            for name, (upserts, deletes) in changes.items():
                new, out[name] = altered(doc.get(name), upserts, deletes)
                if out[name] is None:
                    if new is None:
                        doc.pop(name, None)
                    else:
                        doc[name] = new
        return out

    def credentials(self) -> Users:
        return self._users()
