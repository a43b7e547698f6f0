"""Check a `qr connect --json` report of a transfer at RoCE MTU 1024: the data
arrived intact and the client's socket both cut datagrams into parts and
reassembled the server's (docs/architecture.md §6), so the transfer really
crossed a 1024-byte fabric. Usage: check-segmented.py REPORT.json"""
import json
import sys

r = json.load(open(sys.argv[1]))
s = r["sockets"]["client"]
seg = {k: v for k, v in s.items() if k.startswith("seg_")}
print("segmentation on the client socket:", seg, "path MTU", r["mtu"])
assert r["ok"], "the transfer failed"
assert r["transfer"]["sha256_match"], "sha256 differs"
assert s["seg_datagrams_sent"] > 0, "no datagram was segmented: not a 1024-byte fabric?"
assert s["seg_reassembled"] > 0, "no datagram was reassembled"
assert r["mtu"] > 1024, "QUIC's path MTU should exceed the fabric's 1024"
