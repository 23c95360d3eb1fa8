"""CPU per GB of decrypting TLS records of a given size the way the broker does.

The broker's TLS connections decrypt through the event loop's SSL layer: ciphertext
from the socket goes into a memory BIO and `SSLObject.read` is called into the frame's
buffer until it runs dry, one call per TLS record (OpenSSL returns one record a call).
This does the same in one process, without sockets or the event loop: a client
`SSLObject` writes TOTAL bytes of plaintext in records of each size (one `write` per
record, as librdkafka does per buffer segment), the ciphertext is cut into 256 KiB reads
(uvloop's largest) and the server side's CPU over the decryption is timed. It isolates
what the record size costs the broker; bench/security_cpu.py counts the records a
librdkafka producer actually sends (`client_write_calls_per_gb`).

    python -m bench.tls_records [--out DIR]
"""
from __future__ import annotations

import argparse
import ssl
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import RESULTS, SHARED_BOX, write_result
from bench.security import certs

TOTAL = 256 * 1024 * 1024
SOCKET_READ = 256 * 1024
SIZES = (512, 1024, 1800, 4096, 16384)
REPEATS = 3


def _connected_pair(tmp: Path) -> tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.SSLObject, ssl.MemoryBIO]:
    """(server, its incoming BIO, client, its outgoing BIO), handshake done in memory."""
    tmp.mkdir(parents=True, exist_ok=True)
    ca, cert, key = certs(tmp)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_verify_locations(ca)
    client_ctx.check_hostname = False
    s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname="localhost")
    for _ in range(10):
        for side in (client, server):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
        if c_out.pending:
            s_in.write(c_out.read())
        if s_out.pending:
            c_in.write(s_out.read())
    return server, s_in, client, c_out


def decrypt_cost(tmp: Path, record: int) -> dict:
    server, s_in, client, c_out = _connected_pair(tmp)
    payload = b"x" * record
    chunks = []
    for _ in range(TOTAL // record):
        client.write(payload)
        if c_out.pending >= SOCKET_READ:
            chunks.append(c_out.read(SOCKET_READ))
    chunks.append(c_out.read())
    frame = memoryview(bytearray(TOTAL))
    got = calls = 0
    t0 = time.process_time()
    for chunk in chunks:
        s_in.write(chunk)
        while True:
            try:
                n = server.read(TOTAL - got, frame[got:])
            except ssl.SSLWantReadError:
                break
            if n == 0:      # the frame is full (or the peer closed)
                break
            calls += 1
            got += n
    cpu = time.process_time() - t0
    assert got == TOTAL // record * record, (got, record)
    return {"record_bytes": record, "records": calls, "cpu_s_per_gb": round(cpu / (got / 1e9), 3),
            "us_per_record": round(cpu / calls * 1e6, 3), "cipher": server.cipher()[0]}


def run(out_dir: Path = RESULTS) -> dict:
    rows = []
    with tempfile.TemporaryDirectory(prefix="semel-tlsrec-") as tmp:
        for record in SIZES:
            runs = [decrypt_cost(Path(tmp) / f"{record}-{i}", record) for i in range(REPEATS)]
            row = dict(runs[0])
            row["cpu_s_per_gb"] = statistics.median(r["cpu_s_per_gb"] for r in runs)
            row["us_per_record"] = statistics.median(r["us_per_record"] for r in runs)
            rows.append(row)
            print(row, flush=True)
    result = {"what": f"CPU-s per GB of plaintext for SSLObject.read decrypting TLS records of each size "
                      f"from a memory BIO fed {SOCKET_READ // 1024} KiB at a time, into one buffer "
                      f"(median of {REPEATS} x {TOTAL >> 20} MiB)",
              "machine_role": SHARED_BOX, "openssl": ssl.OPENSSL_VERSION, "rows": rows}
    write_result(out_dir, "tls_records", result)
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=RESULTS)
    run(ap.parse_args().out)
