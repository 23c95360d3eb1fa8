"""SASL on a connected Client (KIP-43 framing: SaslHandshake v1, then SaslAuthenticate),
for PLAIN, SCRAM-SHA-256/512 (scramp computes the SCRAM exchange) and OAUTHBEARER
(RFC 7628: the token goes where the password would)."""
from __future__ import annotations

from ..protocol.errors import KafkaError
from .client import Client, ClientError

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


def authenticate(c: Client, mechanism: str, username: str, password: str) -> None:
    """Log in on c's connection; ClientError (one line) when the broker refuses."""
    if mechanism not in MECHANISMS:
        raise ClientError(f"unknown SASL mechanism {mechanism!r}; known: {', '.join(MECHANISMS)}")
    resp = c.request(17, mechanism=mechanism)
    if resp.error_code:
        raise ClientError(f"SASL {mechanism}: {KafkaError(resp.error_code).name} "
                          f"(the broker offers {', '.join(resp.mechanisms or []) or 'none'})",
                          KafkaError(resp.error_code))
    from scramp import ScramException
    steps = login_steps(mechanism, username, password)
    try:
        token = next(steps)
        while True:
            token = steps.send(_step(c, token))
    except StopIteration:
        return
    except ScramException as exc:   # e.g. the server's proof does not match
        raise ClientError(f"SASL {mechanism}: {exc}") from None


def login_steps(mechanism: str, username: str, password: str):
    """The client's side of one SASL login, apart from any connection (the CLI's blocking
    client and the brokers' asyncio peers drive it): a generator that yields each token to
    send in a SaslAuthenticate and is sent the server's answer to it. Raises scramp's
    ScramException when the server's final message does not prove it knows the user."""
    if mechanism == "PLAIN":
        yield b"\0" + username.encode() + b"\0" + password.encode()
        return
    if mechanism == "OAUTHBEARER":
        # A refused token is answered with an error challenge; the client ends the
        # exchange with one \x01 and the broker's answer to that is the failure.
        if (yield b"n,,\x01auth=Bearer " + password.encode() + b"\x01\x01"):
            yield b"\x01"
        return
    from scramp import ScramClient
    scram = ScramClient([mechanism], username, password)
    scram.set_server_first((yield scram.get_client_first().encode()).decode())
    scram.set_server_final((yield scram.get_client_final().encode()).decode())


def _step(c: Client, data: bytes) -> bytes:
    resp = c.request(36, auth_bytes=data)
    if resp.error_code:
        raise ClientError(f"SASL authentication failed: {resp.error_message or KafkaError(resp.error_code).name}",
                          KafkaError(resp.error_code))
    return resp.auth_bytes or b""
