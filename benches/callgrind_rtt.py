#!/usr/bin/env python3
"""Apportion one request/response round trip from two callgrind runs.

    callgrind_rtt.py ROW DIR TAG N1 N2

DIR/TAG.N1.cg-02 / -03 and DIR/TAG.N2.cg-02 / -03 are the server and client
threads of `bulk-once --peer ROW --rtt N` runs (N1 < N2); DIR/TAG.N.json is
what each run printed. Everything here is (run N2 - run N1) / (N2 - N1): the
handshake, the warm-up, the close and start-up cancel out, what is left is one
round trip. Writes DIR/TAG.md (the tables) and prints one summary line.

Self cost (instructions executed in a function's own code, inlined callees
included) partitions a side's total exactly; it is grouped into categories by
the function's symbol. Inclusive cost (self plus everything called) is given
for the entry points of quinn-proto and of the engine.
"""
import json
import re
import sys
from collections import defaultdict


def parse(path):
    """Self Ir, inclusive Ir, calls received, and callers of each function."""
    names = {}  # compressed fn ids -> names
    self_ir = defaultdict(int)
    incl_calls = defaultdict(int)  # Ir of calls made by fn to others
    calls_in = defaultdict(int)
    callers = defaultdict(lambda: defaultdict(int))  # callee -> caller -> Ir
    total = 0
    fn = cfn = None
    pending_call = 0
    with open(path, errors="replace") as f:
        for line in f:
            if not line or line[0] == "\n" or line[0] == "#":
                continue
            c0 = line[0]
            if c0.isdigit() or c0 in "+-*":
                parts = line.split()
                ir = int(parts[1]) if len(parts) > 1 else 0
                if pending_call:
                    if cfn != fn:
                        incl_calls[fn] += ir
                        callers[cfn][fn] += ir
                    pending_call = 0
                else:
                    self_ir[fn] += ir
                continue
            key, _, val = line.rstrip("\n").partition("=")
            if key in ("fn", "cfn"):
                m = re.match(r"\((\d+)\)(?: (.*))?$", val)
                if m:
                    if m.group(2) is not None:
                        names[m.group(1)] = m.group(2)
                    name = names[m.group(1)]
                else:
                    name = val
                if key == "fn":
                    fn = name
                else:
                    cfn = name
            elif key == "calls":
                n = int(val.split()[0])
                calls_in[cfn] += n
                pending_call = 1
            elif line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
    incl = {k: self_ir.get(k, 0) + incl_calls.get(k, 0) for k in set(self_ir) | set(incl_calls)}
    return {"self": self_ir, "incl": incl, "calls": calls_in, "callers": callers, "total": total}


ALLOC = {"malloc", "__libc_malloc", "calloc", "__libc_calloc", "realloc", "__libc_realloc"}
FREE = {"free", "__libc_free", "cfree"}
ALLOC_INTERNALS = re.compile(
    r"^(_int_malloc|_int_free|_int_realloc|malloc_consolidate|unlink_chunk|sysmalloc|"
    r"tcache_\w+|__rust_alloc|__rust_dealloc|__rust_realloc|__rdl_\w+|"
    r"alloc::alloc::\w+|alloc::raw_vec::\w+.*|<alloc::alloc::Global as .*)"
)


def crate_of(name):
    """The crate a symbol belongs to, looking through `<T as Trait>` and drop glue."""
    n = name
    m = re.match(r"core::ptr::drop_in_place<(.*)>$", n)
    if m:
        n = m.group(1)
    n = n.lstrip("<&*mut ")
    m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)::", n)
    return m.group(1) if m else ""


def category(name):
    if name in ALLOC or name in FREE or ALLOC_INTERNALS.match(name):
        return "allocator (malloc/free)"
    if re.match(r"^__(mem|wmem)\w*|^mem(cpy|move|set|cmp)$|^__nss_database", name):
        return "libc memcpy/memset/memcmp"
    if re.search(r"clock_gettime|Instant::now|Timespec::now|Timespec::sub", name):
        return "clock (Instant::now)"
    if name.startswith(("ring_core_", "_aesni", "_vpaes", "_x86_64", "gcm_", "aes_", "GFp")):
        return "ring (AES-GCM, header protection)"
    c = crate_of(name)
    if c == "ring":
        return "ring (AES-GCM, header protection)"
    if c == "rustls":
        return "rustls (QUIC key wrappers)"
    if c == "quinn_proto":
        return "quinn-proto"
    if c == "quic_rdma":
        for sub, cat in (
            ("quic_rdma::engine", "quic-rdma engine"),
            ("quic_rdma::socket", "quic-rdma socket"),
            ("quic_rdma::fabric::sim", "sim fabric"),
            ("quic_rdma::fabric", "quic-rdma fabric (queues, ledger)"),
            ("quic_rdma::quic", "quic-rdma quic glue (peers, routing)"),
        ):
            if sub in name:
                return cat
        return "quic-rdma other"
    if c == "quic_rdma_benches":
        return "bench harness"
    if c == "tracing" or c == "tracing_core" or c == "log":
        return "tracing/log (disabled spans)"
    if re.search(r"futex|sched_yield|park|unpark|syscall|pthread|__lll_", name):
        return "threads (park, yield, wake)"
    if c in ("bytes", "slab", "hashbrown"):
        return "bytes/slab/hashbrown"
    if c in ("std", "core", "alloc"):
        return "std/core/alloc (generic code)"
    return "other"


ENTRY_POINTS = [
    # (label, regex on the function name)
    ("quinn-proto Endpoint::handle (decode, route, decrypt)", r"^quinn_proto::endpoint::Endpoint::handle$"),
    ("quinn-proto Connection::handle_event (a packet in)", r"^quinn_proto::connection::Connection::handle_event$"),
    ("quinn-proto Connection::poll_transmit", r"^quinn_proto::connection::Connection::poll_transmit$"),
    ("quinn-proto Connection::handle_timeout", r"^quinn_proto::connection::Connection::handle_timeout$"),
    ("quinn-proto Connection::poll_timeout", r"^quinn_proto::connection::Connection::poll_timeout$"),
    ("quinn-proto Connection::poll (app events)", r"^quinn_proto::connection::Connection::poll$"),
    ("quinn-proto Connection::poll_endpoint_events", r"^quinn_proto::connection::Connection::poll_endpoint_events$"),
    ("quinn-proto SendStream::write", r"^quinn_proto::connection::streams::SendStream::write"),
    ("quinn-proto RecvStream::read / Chunks", r"^quinn_proto::connection::streams::(RecvStream::read|recv::Chunks::\w+)"),
    ("quinn-proto process_ack (ACK frames in)", r"on_ack_received|process_ack|detect_lost_packets"),
    ("quic-rdma Engine::poll", r"^quic_rdma::engine::Engine<Q>::poll$"),
    ("quic-rdma Engine::flush", r"^quic_rdma::engine::Engine<Q>::flush$"),
    ("quic-rdma receive (socket -> quinn-proto)", r"^quic_rdma::engine::io::.*::receive$"),
    ("quic-rdma flush_connections (quinn-proto -> socket)", r"^quic_rdma::engine::io::.*::flush_connections$"),
    ("quic-rdma drive_connection", r"^quic_rdma::engine::Engine<Q>::drive_connection$"),
    ("quic-rdma UdSocket::recv_at", r"^quic_rdma::socket::.*::recv_at"),
    ("quic-rdma UdSocket::reap_sends", r"^quic_rdma::socket::.*::reap_sends$"),
    ("ring/rustls packet seal (AEAD encrypt)", r"^<rustls::quic::PacketKey as quinn_proto::crypto::PacketKey>::encrypt$|^rustls::quic::PacketKey::encrypt_in_place"),
    ("ring/rustls packet open (AEAD decrypt)", r"^<rustls::quic::PacketKey as quinn_proto::crypto::PacketKey>::decrypt$|^rustls::quic::PacketKey::decrypt_in_place"),
    ("ring/rustls header protection", r"HeaderKey|header_protection|hp::|encrypt_in_place\w*hp|xor_in_place"),
]


def main():
    row, d, tag, n1, n2 = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    rts = n2 - n1
    sides = {"client": "03", "server": "02"}
    prof = {s: (parse(f"{d}/{tag}.{n1}.cg-{t}"), parse(f"{d}/{tag}.{n2}.cg-{t}")) for s, t in sides.items()}
    runs = {}
    for n in (n1, n2):
        with open(f"{d}/{tag}.{n}.json") as f:
            runs[n] = json.loads(f.read().strip().splitlines()[-1])

    def per_rt(side, field, name):
        a, b = prof[side]
        return (b[field].get(name, 0) - a[field].get(name, 0)) / rts

    def tot(side):
        a, b = prof[side]
        return (b["total"] - a["total"]) / rts

    def count(side, names):
        return sum(per_rt(side, "calls", n) for n in names)

    out = []
    w = out.append
    w(f"# {row}: one 64-byte request/response round trip\n")
    w(f"callgrind, `bulk-once --peer {row} --rtt N --placement same-core --idle sleep`, "
      f"N = {n1} and {n2}; every figure is (run {n2} - run {n1}) / {rts} round trips. "
      "User-space instructions (Ir) only.\n")
    w("| per round trip | client | server |")
    w("|---|---|---|")
    w(f"| instructions (Ir) | {tot('client'):,.0f} | {tot('server'):,.0f} |")
    w(f"| malloc + calloc + realloc calls | {count('client', ALLOC):.2f} | {count('server', ALLOC):.2f} |")
    w(f"| free calls | {count('client', FREE):.2f} | {count('server', FREE):.2f} |")
    polls = [n for n in set(prof["client"][1]["calls"]) | set(prof["server"][1]["calls"])
             if re.match(r"^quic_rdma::engine::Engine<Q>::poll$", n)]
    if polls:
        w(f"| Engine::poll calls | {count('client', polls):.2f} | {count('server', polls):.2f} |")
    pt = "quinn_proto::connection::Connection::poll_transmit"
    if any(prof[s][1]["calls"].get(pt) for s in sides):
        w(f"| poll_transmit calls | {per_rt('client', 'calls', pt):.2f} | {per_rt('server', 'calls', pt):.2f} |")
    sent = {}
    for s in sides:
        a, b = runs[n1].get(f"{s}_sent"), runs[n2].get(f"{s}_sent")
        if a and b:
            sent[s] = {k: (b[k] - a[k]) / rts for k in b}
    if sent:
        for k, label in (("datagrams", "packets sent"), ("stream_frames", "… with a STREAM frame"),
                         ("acks", "ACK frames sent"), ("credit_frames", "MAX_DATA / MAX_STREAM_DATA frames")):
            w(f"| {label} | {sent['client'][k]:.3f} | {sent['server'][k]:.3f} |")
    w("")

    # Categories (self cost, exact partition).
    cats = defaultdict(lambda: [0.0, 0.0])
    names = set()
    for i, s in enumerate(("client", "server")):
        a, b = prof[s]
        for n in set(a["self"]) | set(b["self"]):
            v = (b["self"].get(n, 0) - a["self"].get(n, 0)) / rts
            cats[category(n)][i] += v
            names.add(n)
    both = tot("client") + tot("server")
    w("## Where the instructions go (self cost by category)\n")
    w("| category | client Ir | server Ir | share of both |")
    w("|---|---|---|---|")
    for c, (cv, sv) in sorted(cats.items(), key=lambda kv: -(kv[1][0] + kv[1][1])):
        if abs(cv) + abs(sv) < 0.5:
            continue
        w(f"| {c} | {cv:,.0f} | {sv:,.0f} | {100 * (cv + sv) / both:.1f} % |")
    w("")

    w("## Entry points (inclusive: the function and all it calls)\n")
    w("| entry point | client Ir | server Ir | client calls | server calls |")
    w("|---|---|---|---|---|")
    for label, rx in ENTRY_POINTS:
        r = re.compile(rx)
        matched = [n for n in names | set(prof["client"][1]["incl"]) | set(prof["server"][1]["incl"]) if r.search(n)]
        if not matched:
            continue
        vals = []
        for s in ("client", "server"):
            vals.append(sum(per_rt(s, "incl", n) for n in matched))
            vals.append(sum(per_rt(s, "calls", n) for n in matched))
        w(f"| {label} | {vals[0]:,.0f} | {vals[2]:,.0f} | {vals[1]:.2f} | {vals[3]:.2f} |")
    w("")

    w("## Functions (self cost, top 60 by both sides)\n")
    w("| function | category | client Ir | server Ir | client calls | server calls |")
    w("|---|---|---|---|---|---|")
    rows = []
    for n in names:
        cv, sv = per_rt("client", "self", n), per_rt("server", "self", n)
        rows.append((cv + sv, n, cv, sv))
    rows.sort(reverse=True)
    for _, n, cv, sv in rows[:60]:
        cc, sc = per_rt("client", "calls", n), per_rt("server", "calls", n)
        short = n if len(n) < 110 else n[:107] + "..."
        short = short.replace("|", "\\|")
        w(f"| `{short}` | {category(n)} | {cv:,.0f} | {sv:,.0f} | {cc:.2f} | {sc:.2f} |")
    w("")

    # Who calls the generic and allocator code (where it belongs).
    w("## Callers of the generic, allocator and hashing code (both sides, Ir per round trip)\n")
    for _, n, cv, sv in rows[:60]:
        if category(n) not in ("std/core/alloc (generic code)", "allocator (malloc/free)", "bytes/slab/hashbrown",
                               "libc memcpy/memset/memcmp", "tracing/log (disabled spans)"):
            continue
        if cv + sv < 20:
            continue
        callers = defaultdict(float)
        for s in sides:
            a, b = prof[s]
            for caller, v in b["callers"].get(n, {}).items():
                callers[caller] += (v - a["callers"].get(n, {}).get(caller, 0)) / rts
        top = sorted(callers.items(), key=lambda kv: -kv[1])[:4]
        shown = "; ".join(f"`{c[:80]}` {v:,.0f}" for c, v in top if v >= 1)
        w(f"- `{n[:90]}` ({cv + sv:,.0f}): {shown}")
    w("")
    with open(f"{d}/{tag}.md", "w") as f:
        f.write("\n".join(out))
    line = f"{row:20s} client {tot('client'):9,.0f} Ir  server {tot('server'):9,.0f} Ir  "
    line += f"malloc {count('client', ALLOC):.2f}/{count('server', ALLOC):.2f}  "
    if sent:
        line += f"packets {sent['client']['datagrams']:.2f}/{sent['server']['datagrams']:.2f}  "
    line += f"p50 (under valgrind) {runs[n2]['p50_ns'] / 1000:.1f} us"
    print(line)


if __name__ == "__main__":
    main()
