#!/usr/bin/env python3
"""Summarise BenchmarkSyncInstall and BenchmarkSyncInstallSpaced run in turns
(the "=== round R build NAME" lines, then the benchmarks' lines): per build
the median and range of each metric, and per build against the first named
the paired difference (rounds paired) with a 95 % t interval of its mean.

usage: install.py FILE A B [C...]
"""
import re
import statistics as st
import sys

T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}


def main():
    path, builds = sys.argv[1], sys.argv[2:]
    runs, cur = {}, None
    for line in open(path):
        m = re.match(r"=== round (\d+) build (\S+)", line)
        if m:
            cur = (int(m.group(1)), m.group(2))
            runs[cur] = {}
            continue
        m = re.match(r"(BenchmarkSyncInstall\S*?)-\d+\s+\d+\s+(.*)", line)
        if m and cur:
            for v, unit in re.findall(r"([\d.]+) (\S+/(?:conn|rec))", m.group(2)):
                runs[cur][f"{m.group(1)} {unit}"] = float(v)
    rounds = sorted({r for r, _ in runs})
    keys = sorted({k for v in runs.values() for k in v})
    a = builds[0]
    print(f"rounds: {len(rounds)}\n")
    print("| metric | " + " | ".join(f"{b}: median (range)" for b in builds) + " | " +
          " | ".join(f"{b} - {a}: mean, 95 % t interval" for b in builds[1:]) + " |")
    print("|---" * (2 * len(builds)) + "|")
    for k in keys:
        cells = []
        for b in builds:
            v = [runs[(r, b)][k] for r in rounds if k in runs.get((r, b), {})]
            cells.append(f"{st.median(v):.0f} ({min(v):.0f}-{max(v):.0f})")
        for b in builds[1:]:
            d = [runs[(r, b)][k] - runs[(r, a)][k] for r in rounds
                 if k in runs.get((r, b), {}) and k in runs.get((r, a), {})]
            m, h = st.mean(d), T95[len(d) - 1] * st.stdev(d) / len(d) ** 0.5
            cells.append(f"{m:.0f} [{m - h:.0f}, {m + h:.0f}]")
        print(f"| {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
