"""SCRAM credentials, never passwords: per user and mechanism the salt, stored key,
server key and iteration count (RFC 5802), as Kafka keeps them. PLAIN logins are
checked against the same salted hash."""
from __future__ import annotations

import base64
import hmac
from pathlib import Path

import scramp

from .store import JsonStore

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
ITERATIONS = 4096   # Kafka's minimum for SCRAM credentials
FILE_NAME = "__users.json"


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _unb64(s: str) -> bytes:
    return base64.b64decode(s)


def _check_users(doc: dict) -> None:
    for creds in doc.values():
        for cred in creds.values():
            _unb64(cred["salt"]), _unb64(cred["stored_key"]), _unb64(cred["server_key"]), int(cred["iterations"])


def make_credentials(name: str, password: str, mechanisms=MECHANISMS) -> dict:
    """{mechanism: salted credential} for a new password: what every user store keeps."""
    if not name or not password:
        raise ValueError("user name and password must not be empty")
    creds = {}
    for mech in mechanisms:
        if mech not in MECHANISMS:
            raise ValueError(f"unknown mechanism {mech!r} (known: {', '.join(MECHANISMS)})")
        salt, stored, server, iters = scramp.ScramMechanism(mech).make_auth_info(
            password, iteration_count=ITERATIONS)
        creds[mech] = {"salt": _b64(salt), "stored_key": _b64(stored), "server_key": _b64(server),
                       "iterations": iters}
    return creds


class CredentialReader:
    """Logins checked against {user: {mechanism: credential}} as `_users()` gives it
    (a file under the data dir here, etcd in a cluster: semel.cluster.security)."""

    def _users(self) -> dict:
        raise NotImplementedError

    def names(self) -> dict[str, list[str]]:
        return {name: sorted(creds) for name, creds in sorted(self._users().items())}

    def auth_info(self, name: str, mechanism: str):
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

    def _users(self) -> dict:
        return self.store.read()

    def add(self, name: str, password: str, mechanisms=MECHANISMS) -> None:
        creds = make_credentials(name, password, mechanisms)
        with self.store.update() as doc:
            doc[name] = creds

    def delete(self, name: str) -> bool:
        with self.store.update() as doc:
            return doc.pop(name, None) is not None
