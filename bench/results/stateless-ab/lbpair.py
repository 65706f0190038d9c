#!/usr/bin/env python3
# BenchmarkTablesLBPair runs (one line per run and n, the benchmark's own output, in the files
# given): per n and metric, the median over runs, the range, and the mean with Student's t 95 %
# interval. The metrics are each run's medians over chunks (ratios: without the list / with it,
# the rate with the list against the rate without; stls-aa-path: two farms alike).
import re, sys, math, statistics as st

def tq(df):
    z = 1.959964
    return z + (z**3+z)/4/df + (5*z**5+16*z**3+3*z)/96/df**2 + (3*z**7+19*z**5+17*z**3-15*z)/384/df**3

runs = {}
for path in sys.argv[1:]:
    for l in open(path):
        m = re.match(r'BenchmarkTablesLBPair/n=(\d+)-\d+\s+\d+\s+(.*)', l.strip())
        if not m:
            continue
        vals = dict((k, float(v)) for v, k in re.findall(r'([\d.]+) (\S+)', m.group(2)))
        # The program's own rate ratio, from its time per packet.
        vals['stls-bpf'] = vals['stls-0-bpf-ns/pkt'] / vals['stls-list-bpf-ns/pkt']
        vals['dnat-bpf'] = vals['dnat-0-bpf-ns/pkt'] / vals['dnat-list-bpf-ns/pkt']
        vals['stls-list-bpf-extra'] = vals['stls-list-bpf-ns/pkt'] - vals['stls-0-bpf-ns/pkt']
        runs.setdefault(int(m.group(1)), []).append(vals)
order = ['stls-path', 'stls-aa-path', 'stls-lb', 'stls-bpf', 'stls-list-bpf-extra', 'dnat-path', 'dnat-lb', 'dnat-bpf',
         'local-cpu-ns/pkt', 'stls-0-cpu-ns/pkt', 'stls-list-cpu-ns/pkt', 'stls-0-bpf-ns/pkt', 'stls-list-bpf-ns/pkt',
         'dnat-0-bpf-ns/pkt', 'dnat-list-bpf-ns/pkt']
for n in sorted(runs):
    print('\nn=%d (%d runs)\n\n| metric | median (min - max) | mean, 95 %% interval |\n|---|---|---|' % (n, len(runs[n])))
    for k in order:
        v = [r[k] for r in runs[n] if k in r]
        if len(v) < 2:
            continue
        m = st.mean(v); h = tq(len(v)-1)*st.stdev(v)/math.sqrt(len(v))
        f = '%.1f' if abs(m) > 5 else '%.3f'
        print(('| %s | ' + f + ' (' + f + ' - ' + f + ') | ' + f + ' [' + f + ', ' + f + '] |') % (k, st.median(v), min(v), max(v), m, m-h, m+h))
