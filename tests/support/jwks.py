"""An identity provider for signed-OAUTHBEARER tests: signing keys (RSA, EC), their
JWKS as a file or served over a local http.server, and tokens signed with them."""
from __future__ import annotations

import json
import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

ISSUER = "https://idp.test"
AUDIENCE = "semel"


@dataclass
class SigningKey:
    kid: str
    alg: str
    private: object

    def jwk(self) -> dict:
        algo = ECAlgorithm if self.alg.startswith("ES") else RSAAlgorithm
        return {**algo.to_jwk(self.private.public_key(), as_dict=True), "kid": self.kid, "use": "sig"}

    def sign(self, claims: dict, **header) -> str:
        return jwt.encode(claims, self.private, algorithm=self.alg, headers={"kid": self.kid, **header})


def rsa_key(kid: str, alg: str = "RS256") -> SigningKey:
    return SigningKey(kid, alg, rsa.generate_private_key(public_exponent=65537, key_size=2048))


def ec_key(kid: str, alg: str = "ES256") -> SigningKey:
    curve = {"ES256": ec.SECP256R1(), "ES384": ec.SECP384R1(), "ES512": ec.SECP521R1()}[alg]
    return SigningKey(kid, alg, ec.generate_private_key(curve))


def jwks_doc(*keys: SigningKey) -> bytes:
    return json.dumps({"keys": [k.jwk() for k in keys]}).encode()


def claims(sub: str = "alice", now: float | None = None, **over) -> dict:
    """Claims a broker with ISSUER and AUDIENCE expected accepts (`over`: None removes one)."""
    now = time.time() if now is None else now
    out = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": int(now), "exp": int(now) + 3600, **over}
    return {k: v for k, v in out.items() if v is not None}


class JwksServer:
    """A JWKS over http on 127.0.0.1 (https with `tls` = (certfile, keyfile)); `doc` can
    change (key rotation); `requests` counts the fetches; `fail` answers 500 instead."""

    def __init__(self, doc: bytes, tls: tuple | None = None):
        self.doc = doc
        self.fail = False
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                owner.requests += 1
                body, code = (b"down", 500) if owner.fail else (owner.doc, 200)
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):   # quiet test output
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(*tls)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}/jwks.json"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "JwksServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)


def write_jwks(path: Path, *keys: SigningKey) -> Path:
    path.write_bytes(jwks_doc(*keys))
    return path
