"""An independent QUIC client (aioquic, over plain UDP) for `qr serve`'s workload.

Used by tools/tests/gateway_udp_path.rs through `qr gateway to-fabric`. Each
client opens one bidirectional stream (ALPN qr-demo/1), writes BYTES seeded
bytes and FIN, and reads the server's verdict: 8 bytes of length (big-endian)
and the SHA-256 of what it received. It checks both against what it sent.

Usage: aioquic_client.py HOST PORT CERT_DER BYTES CLIENTS [SERVER_NAME]
Prints one JSON line per client; exits 0 only if every client's verdict matched.
"""

import asyncio
import hashlib
import json
import ssl
import sys
import time

from aioquic.asyncio import connect
from aioquic.quic.configuration import QuicConfiguration
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

CHUNK = 64 * 1024


def payload(seed: int, offset: int, n: int) -> bytes:
    # Deterministic, differs per client and per chunk.
    block = hashlib.sha256(f"{seed}:{offset}".encode()).digest()
    return (block * (n // len(block) + 1))[:n]


async def one_client(i, host, port, ca_pem, total, server_name):
    config = QuicConfiguration(is_client=True, alpn_protocols=["qr-demo/1"])
    config.verify_mode = ssl.CERT_REQUIRED
    config.load_verify_locations(cadata=ca_pem)
    config.server_name = server_name
    started = time.monotonic()
    sent = hashlib.sha256()
    async with connect(host, port, configuration=config, wait_connected=True) as conn:
        handshake = time.monotonic() - started
        reader, writer = await conn.create_stream()
        offset = 0
        while offset < total:
            n = min(CHUNK, total - offset)
            data = payload(i, offset, n)
            sent.update(data)
            writer.write(data)
            await writer.drain()
            offset += n
        writer.write_eof()
        verdict = await reader.read()
        conn.close()
    got_len = int.from_bytes(verdict[:8], "big") if len(verdict) >= 8 else None
    got_sha = verdict[8:40].hex()
    ok = len(verdict) == 40 and got_len == total and got_sha == sent.hexdigest()
    return {
        "client": i,
        "ok": ok,
        "bytes": total,
        "sha256_sent": sent.hexdigest(),
        "sha256_server": got_sha,
        "bytes_server": got_len,
        "handshake_s": round(handshake, 3),
        "total_s": round(time.monotonic() - started, 3),
    }


async def main():
    host, port, cert, total, clients = sys.argv[1:6]
    server_name = sys.argv[6] if len(sys.argv) > 6 else "localhost"
    with open(cert, "rb") as f:
        der = f.read()
    ca_pem = x509.load_der_x509_certificate(der).public_bytes(Encoding.PEM)
    tasks = [
        one_client(i, host, int(port), ca_pem, int(total), server_name)
        for i in range(int(clients))
    ]
    results = await asyncio.gather(*tasks, return_exceptions=True)
    all_ok = True
    for i, r in enumerate(results):
        if isinstance(r, BaseException):
            r = {"client": i, "ok": False, "error": f"{type(r).__name__}: {r}"}
        all_ok &= r["ok"]
        print(json.dumps(r), flush=True)
    sys.exit(0 if all_ok else 1)


asyncio.run(main())
