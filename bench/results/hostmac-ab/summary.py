#!/usr/bin/env python3
# A/B in turns: lines "rN old|new BenchmarkX-2 <iters> <value> <unit> ..." in the files given.
# Per benchmark and unit: old and new medians (min - max) and new against old, the mean
# difference with Welch's 95 % interval, in per cent of old's mean.
import re, sys, math, statistics as st

def tq(df):
    z = 1.959964
    return z + (z**3+z)/4/df + (5*z**5+16*z**3+3*z)/96/df**2 + (3*z**7+19*z**5+17*z**3-15*z)/384/df**3

units = sys.argv[1].split(',')
data = {}
for path in sys.argv[2:]:
    for l in open(path):
        f = l.split()
        if len(f) < 5 or f[1] not in ('old', 'new'):
            continue
        for v, u in zip(f[4::2], f[5::2]):
            if u in units:
                data.setdefault((f[2], u), {}).setdefault(f[1], []).append(float(v))
print('| benchmark | metric | old: median (min - max) | new: median (min - max) | new against old (95 %, Welch) |')
print('|---|---|---|---|---|')
for (b, u), d in sorted(data.items()):
    a, n = d.get('old', []), d.get('new', [])
    if len(a) < 2 or len(n) < 2:
        continue
    va, vn = st.variance(a)/len(a), st.variance(n)/len(n)
    df = (va+vn)**2/((va**2/(len(a)-1) if va else 0)+(vn**2/(len(n)-1) if vn else 0) or 1)
    diff = st.mean(n)-st.mean(a); h = tq(df)*math.sqrt(va+vn)
    pct = lambda x: 100*x/st.mean(a)
    print('| %s | %s | %.1f (%.1f - %.1f), %d | %.1f (%.1f - %.1f), %d | %+.1f %% ± %.1f %% (%s) |' % (
        re.sub(r'-2$', '', b), u, st.median(a), min(a), max(a), len(a), st.median(n), min(n), max(n), len(n),
        pct(diff), pct(h), 'significant' if abs(diff) > h else 'not significant'))
