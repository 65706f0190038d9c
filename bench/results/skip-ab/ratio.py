#!/usr/bin/env python3
# BenchmarkTablesStateless A/B in turns (lines "rN old|new BenchmarkTablesStateless/list=L-2 ... X ns/pkt"
# in the files given): per build, per list, the ratio list=none / list=L of each run (the rate with
# the list against the rate without, in the program's own time per packet), and new against old per
# list (Welch). 95 % intervals: Student's t over the runs.
import re, sys, math, statistics as st

def tq(df):  # two-sided 95 % Student t quantile (Cornish-Fisher from the normal's 1.95996)
    z = 1.959964
    g1 = (z**3 + z) / 4
    g2 = (5*z**5 + 16*z**3 + 3*z) / 96
    g3 = (3*z**7 + 19*z**5 + 17*z**3 - 15*z) / 384
    return z + g1/df + g2/df**2 + g3/df**3

runs = {}  # (round, build) -> {list: ns}
for path in sys.argv[1:]:
    for l in open(path):
        m = re.match(r'(\S+) (old|new) BenchmarkTablesStateless/list=(\w+)-2\s+\d+\s+\d+ ns/op\s+([\d.]+) ns/pkt', l.strip())
        if m:
            runs.setdefault((path, m.group(1), m.group(2)), {})[m.group(3)] = float(m.group(4))
lists = ['0', '1000', '1000000']
by = {'old': [], 'new': []}
for (_, _, w), r in sorted(runs.items()):
    if 'none' in r:
        by[w].append(r)
def ci(xs):
    n = len(xs)
    return st.mean(xs), tq(n-1)*st.stdev(xs)/math.sqrt(n)
for w in ['old', 'new']:
    rs = by[w]
    print('%s: %d runs; list=none ns/pkt median %.1f (%.1f - %.1f)' % (w, len(rs), st.median([r['none'] for r in rs]), min(r['none'] for r in rs), max(r['none'] for r in rs)))
    for lst in lists:
        sel = [r for r in rs if lst in r]
        if len(sel) < 2: continue
        ratios = [r['none']/r[lst] for r in sel]
        d = [r[lst]-r['none'] for r in sel]
        m, h = ci(ratios); dm, dh = ci(d)
        print('  list=%s: ratio median %.3f (%.3f - %.3f), mean %.3f ± %.3f -> [%.3f, %.3f]; extra ns median %+.1f, mean %+.1f ± %.1f'
              % (lst, st.median(ratios), min(ratios), max(ratios), m, h, m-h, m+h, st.median(d), dm, dh))
for lst in ['none'] + lists:
    a = [r[lst] for r in by['old'] if lst in r]; b = [r[lst] for r in by['new'] if lst in r]
    if len(a) < 2 or len(b) < 2: continue
    va, vb = st.variance(a)/len(a), st.variance(b)/len(b)
    df = (va+vb)**2/(va**2/(len(a)-1)+vb**2/(len(b)-1))
    diff = st.mean(b)-st.mean(a); h = tq(df)*math.sqrt(va+vb)
    print('list=%s: old median %.1f, new median %.1f; new - old %+.1f ± %.1f ns (%+.1f %% ± %.1f %%, Welch 95 %%): %s'
          % (lst, st.median(a), st.median(b), diff, h, 100*diff/st.mean(a), 100*h/st.mean(a), 'significant' if abs(diff) > h else 'not significant'))
