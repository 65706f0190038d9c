#!/usr/bin/env python3
"""Summarise an A/B of BenchmarkSyncPerPacket run in turns (ctinstall-ab.sh's
output: "=== round R build NAME" lines, then the benchmark's lines).

Per round and build, for each K: the on/off ratio of cpu-ns/pkt, the sync
CPU per flow ((on - off) * K, µs), and the same for the threads other than
the packets' (cpu-ns/pkt less thread-ns/pkt). Then per build the median and
range, and per K the paired difference (B - A, rounds paired) with its
median and a 95 % t interval of its mean.

usage: summary.py FILE A B
"""
import re
import statistics as st
import sys

# two-sided 95 % t quantiles by degrees of freedom
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
       10: 2.23, 11: 2.20, 12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13, 16: 2.12, 17: 2.11,
       18: 2.10, 19: 2.09, 20: 2.09, 25: 2.06, 30: 2.04}


def t95(df):
    return T95.get(df) or T95[max(k for k in T95 if k <= df)]


def parse(path):
    runs = {}  # (round, build) -> {(K, on): (cpu, thread)}
    cur = None
    for line in open(path):
        m = re.match(r"=== round (\d+) build (\S+)", line)
        if m:
            cur = (int(m.group(1)), m.group(2))
            runs[cur] = {}
            continue
        m = re.match(r"BenchmarkSyncPerPacket/K=(\d+)/sync=(on|off)\S*\s+\d+\s+([\d.]+) cpu-ns/pkt.*?([\d.]+) thread-ns/pkt", line)
        if m and cur:
            runs[cur][(int(m.group(1)), m.group(2) == "on")] = (float(m.group(3)), float(m.group(4)))
    return runs


def metrics(r, k):
    (c0, t0), (c1, t1) = r[(k, False)], r[(k, True)]
    return {"ratio": c1 / c0, "sync µs/flow": (c1 - c0) * k / 1000,
            "others' sync µs/flow": ((c1 - t1) - (c0 - t0)) * k / 1000,
            "off ns/pkt": c0, "on ns/pkt": c1}


def main():
    path, a, b = sys.argv[1:4]
    runs = parse(path)
    rounds = sorted({r for r, _ in runs})
    ks = sorted({k for v in runs.values() for k, _ in v})
    print(f"rounds: {len(rounds)}; A = {a}, B = {b}\n")
    print("| K | metric | A median (range) | B median (range) | B - A, paired: median | mean, 95 % t interval |")
    print("|---|---|---|---|---|---|")
    for k in ks:
        for name in ["ratio", "sync µs/flow", "others' sync µs/flow"]:
            va, vb, d = [], [], []
            for r in rounds:
                ra, rb = runs.get((r, a)), runs.get((r, b))
                if not ra or not rb or (k, True) not in ra or (k, True) not in rb:
                    continue
                x, y = metrics(ra, k)[name], metrics(rb, k)[name]
                va.append(x), vb.append(y), d.append(y - x)
            n = len(d)
            m = st.mean(d)
            h = t95(n - 1) * st.stdev(d) / n ** 0.5 if n > 1 else float("nan")
            f = "%.3f" if name == "ratio" else "%.2f"
            print(f"| {k} | {name} | {f % st.median(va)} ({f % min(va)}-{f % max(va)}) | "
                  f"{f % st.median(vb)} ({f % min(vb)}-{f % max(vb)}) | {f % st.median(d)} | "
                  f"{f % m} [{f % (m - h)}, {f % (m + h)}] |")


if __name__ == "__main__":
    main()
