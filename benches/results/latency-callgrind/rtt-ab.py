#!/usr/bin/env python3
"""Interleaved wall-clock A/B of two `compare` binaries on the RTT workload.

    rtt-ab.py BASE_BIN NEW_BIN ROUNDS ROWS [RTT_ITERS] [OUT_DIR]

Runs `BIN --only rtt --repeats 1 --rows ROWS --rtt-iters RTT_ITERS` for BASE,
NEW, BASE, NEW, ... (ROUNDS pairs, the order alternating so neither binary
always goes first), each into OUT_DIR/<bin>.<round>, and prints each row's
p50 per placement for every run, the median and range per binary, and the
load average around each run. Wall clock drifts on a shared VM: only the
interleaved comparison, and the raw-UD floor beside the engine rows in the
same run, mean much.
"""
import json
import os
import statistics
import subprocess
import sys

base, new, rounds, rows = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
iters = sys.argv[5] if len(sys.argv) > 5 else "20000"
out = sys.argv[6] if len(sys.argv) > 6 else "/tmp/rtt-ab"
res = {}  # (bin, row, placement) -> [p50]
for r in range(rounds):
    order = [("base", base), ("new", new)] if r % 2 == 0 else [("new", new), ("base", base)]
    for tag, b in order:
        d = f"{out}/{tag}.{r}"
        load = os.getloadavg()[0]
        subprocess.run([b, "--only", "rtt", "--repeats", "1", "--rows", rows, "--rtt-iters", iters,
                        "--out", d], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        j = json.load(open(f"{d}/compare.json"))
        line = [f"round {r} {tag:4s} load {load:.2f}->{os.getloadavg()[0]:.2f} others {j['machine'].get('others_cpu_share', 0):.3f}"]
        for row in j["rows"]:
            for cell in row.get("rtt") or []:
                for run in cell["runs"]:
                    res.setdefault((tag, row["name"], cell["placement"]), []).append(run["p50_us"])
                    line.append(f"{row['name']}@{cell['placement'][:4]} {run['p50_us']:.2f}")
        print("  ".join(line), flush=True)
print()
keys = sorted({(k[1], k[2]) for k in res})
for row, place in keys:
    parts = []
    for tag in ("base", "new"):
        v = res.get((tag, row, place), [])
        if v:
            parts.append(f"{tag} {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})")
    print(f"{row:20s} {place:15s} p50 us: " + "   ".join(parts))
