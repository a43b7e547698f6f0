#!/usr/bin/env python3
"""Interleaved A/B of bulk transfers run as two processes: a harness row's
side processes (`compare --side`) against standalone peer pairs, or two
builds of a peer against each other (issue 13, item 1; see peers.md).

usage: peers-ab.py RELEASE_DIR REPEATS BYTES ARM [ARM ...]
  ARM = row:ROW_NAME                 e.g. row:quinn/udp-4096 (RELEASE_DIR/compare)
      | peer:BIN[:ENV=V,ENV=V][@IP]  e.g. peer:peer-quinn-udp, peer:/tmp/old/peer-quinn-udp
Every repeat runs every arm once; the order rotates each repeat and reverses
every len(ARM) repeats. Prints each run, then per arm the median (min-max)
Gbit/s and CPU s per side, and the first arm's ratio to every other arm (of
medians, and the median of the per-repeat ratios). Needs python3 with
`cryptography` (for the certificate the harness's side processes load).
Ports 19790-19799 on 127.0.130.1."""
import json, os, subprocess, sys, statistics, tempfile
rel, reps, nbytes, arms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
tmp = tempfile.mkdtemp()
# TLS file in the harness format: u32 LE cert length, cert DER, PKCS8 key DER.
from cryptography import x509
from cryptography.x509.oid import NameOID
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
import datetime
_k = ec.generate_private_key(ec.SECP256R1())
_n = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
_now = datetime.datetime.now(datetime.timezone.utc)
_c = (x509.CertificateBuilder().subject_name(_n).issuer_name(_n).public_key(_k.public_key())
      .serial_number(x509.random_serial_number()).not_valid_before(_now - datetime.timedelta(days=1))
      .not_valid_after(_now + datetime.timedelta(days=2))
      .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
      .sign(_k, hashes.SHA256()))
open(f"{tmp}/c.der","wb").write(_c.public_bytes(serialization.Encoding.DER))
open(f"{tmp}/k.der","wb").write(_k.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
cert = open(f"{tmp}/c.der","rb").read(); key = open(f"{tmp}/k.der","rb").read()
tlsf = f"{tmp}/tls.bin"; open(tlsf,"wb").write(len(cert).to_bytes(4,"little")+cert+key)

def run(server, client_of, env):
    s = subprocess.Popen(server, stdout=subprocess.PIPE, text=True, env=env)
    line = s.stdout.readline().split(); assert line and line[0] == "listening", line
    c = subprocess.run(client_of(line[1]), stdout=subprocess.PIPE, text=True, env=env, timeout=300)
    sout = s.communicate(timeout=300)[0]
    assert c.returncode == 0 and s.returncode == 0
    return json.loads(c.stdout.strip().splitlines()[-1]), json.loads(sout.strip().splitlines()[-1])
port = [0]
def arm_run(arm):
    # kind:name[:ENV=V,ENV=V][@ip]
    ip = "127.0.130.1"
    if "@" in arm: arm, ip = arm.split("@")
    parts = arm.split(":")
    kind, name = parts[0], parts[1]
    env = dict(os.environ, QUIC_RDMA_BENCH_TLS=tlsf)
    if len(parts) > 2:
        env.update(dict(e.split("=",1) for e in parts[2].split(",")))
    if kind == "row":
        base = [f"{rel}/compare", "--row", name, "--work", "bulk", "--bulk-bytes", str(nbytes)]
        return run(base + ["--side", "server", "--cpu", "1"], lambda a: base + ["--side", "client", "--cpu", "0", "--addr", a], env)
    port[0] = (port[0] + 1) % 10
    addr = f"{ip}:{19790 + port[0]}"
    certf = f"{tmp}/peer-{port[0]}.der"
    exe = name if name.startswith("/") else f"{rel}/{name}"
    a = lambda role, cpu: [exe, role, "--addr", addr, "--bytes", str(nbytes), "--cpu", str(cpu), "--cert", certf]
    return run(a("server", 1), lambda _: a("client", 0), env)
res = {}
def rec(name, c, s):
    g = nbytes*8/c["secs"]/1e9
    ok = c["ok"] and s["ok"]
    cc = c["cpu"]["user_s"]+c["cpu"]["sys_s"]; sc = s["cpu"]["user_s"]+s["cpu"]["sys_s"]
    res.setdefault(name, []).append((g, cc, sc, ok))
    print(f"  {name:40} {g:6.2f} Gbit/s cpu {cc:.2f}/{sc:.2f} {'ok' if ok else 'MISMATCH'}", flush=True)
load0 = os.getloadavg()
for r in range(reps):
    print(f"[{r}] load {os.getloadavg()[0]:.2f}", flush=True)
    k = r % len(arms)
    order = arms[k:] + arms[:k]
    if (r // len(arms)) % 2: order = order[::-1]
    for arm in order:
        c, s = arm_run(arm)
        rec(arm, c, s)
print(f"load at start {tuple(round(x,2) for x in load0)}, at end {tuple(round(x,2) for x in os.getloadavg())}")
med = {}
for n in arms:
    v = res[n]; gs = [x[0] for x in v]; med[n] = statistics.median(gs)
    print(f"{n:40} {med[n]:6.2f} ({min(gs):.2f}–{max(gs):.2f}) Gbit/s  cpu c/s {statistics.median([x[1] for x in v]):.2f}/{statistics.median([x[2] for x in v]):.2f} s  n={len(v)} ok={all(x[3] for x in v)}")
for n in arms[1:]:
    pr = [a[0]/b[0] for a, b in zip(res[arms[0]], res[n])]
    print(f"{arms[0]} / {n}: {med[arms[0]]/med[n]:.2f} (per-repeat {statistics.median(pr):.2f}, {min(pr):.2f}–{max(pr):.2f})")
