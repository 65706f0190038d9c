#!/usr/bin/env python3
# BenchmarkTablesStatelessPair A/B in turns (lines "rN old|new BenchmarkTablesStatelessPair/list=L-2 ...
# X none/list" in the files given): per build and list, the runs' none/list ratios (the rate with the
# list against the rate without, in the program's own time, the two planes taking turns in each run),
# mean with Student's t 95 % interval, and new against old (Welch).
import re, sys, math, statistics as st

def tq(df):
    z = 1.959964
    return z + (z**3+z)/4/df + (5*z**5+16*z**3+3*z)/96/df**2 + (3*z**7+19*z**5+17*z**3-15*z)/384/df**3

by = {}
for path in sys.argv[1:]:
    for l in open(path):
        m = re.match(r'\S+ (old|new) BenchmarkTablesStatelessPair/list=(\w+)-2\s.*?([\d.]+) none/list', l.strip())
        if m:
            ln = re.search(r'([\d.]+) list-ns/pkt', l); nn = re.search(r'([\d.]+) none-ns/pkt', l)
            by.setdefault((m.group(2), m.group(1)), []).append((float(m.group(3)), float(nn.group(1)), float(ln.group(1))))
for lst in sorted({k[0] for k in by}, key=int):
    for w in ['old', 'new']:
        rs = by.get((lst, w), [])
        if len(rs) < 2: continue
        r = [x[0] for x in rs]; n = len(r)
        m = st.mean(r); h = tq(n-1)*st.stdev(r)/math.sqrt(n)
        print('list=%s %s: %d runs; none %.1f / list %.1f ns/pkt (medians); none/list median %.3f (%.3f - %.3f), mean %.3f ± %.3f -> [%.3f, %.3f]'
              % (lst, w, n, st.median(x[1] for x in rs), st.median(x[2] for x in rs), st.median(r), min(r), max(r), m, h, m-h, m+h))
    a = [x[0] for x in by.get((lst, 'old'), [])]; b = [x[0] for x in by.get((lst, 'new'), [])]
    if len(a) > 1 and len(b) > 1:
        va, vb = st.variance(a)/len(a), st.variance(b)/len(b)
        df = (va+vb)**2/(va**2/(len(a)-1)+vb**2/(len(b)-1))
        d = st.mean(b)-st.mean(a); h = tq(df)*math.sqrt(va+vb)
        print('list=%s: new - old ratio %+.3f ± %.3f (Welch 95 %%): %s' % (lst, d, h, 'significant' if abs(d) > h else 'not significant'))
