import re,statistics as st,math,sys
d={'old':{},'new':{}}
# Summary of the A/B in bench/results/dscp-ab.md: python3 summary.py DIR
# (DIR holds tables-ab-old.txt and tables-ab-new.txt, lines "rN Benchmark...").
base = sys.argv[1] if len(sys.argv) > 1 else '.'
for w in d:
    for l in open(f'{base}/tables-ab-{w}.txt'):
        m=re.match(r'r(\d+) (Benchmark\S+?)-2\s.*?([\d.]+) ns/pkt',l)
        if not m: continue
        d[w].setdefault(m.group(2),{})[int(m.group(1))]=float(m.group(3))
# t quantiles 0.975
tq={1:12.71,2:4.303,3:3.182,4:2.776,5:2.571,6:2.447,7:2.365,8:2.306,9:2.262,10:2.228,12:2.179,15:2.131,20:2.086}
def t(df):
    df=max(1,int(df)); ks=sorted(tq); 
    for k in ks:
        if df<=k: return tq[k]
    return 1.96
print("| benchmark | rounds | old ns/pkt median [min-max] | new ns/pkt median [min-max] | new/old medians | new-old paired mean, 95 % CI (ns) | Welch 95 % CI (ns) |")
print("|---|---|---|---|---|---|---|")
for b in d['old']:
    rs=sorted(set(d['old'][b])&set(d['new'].get(b,{})))
    if not rs: continue
    o=[d['old'][b][r] for r in rs]; n=[d['new'][b][r] for r in rs]
    diffs=[y-x for x,y in zip(o,n)]
    md=st.mean(diffs); sd=st.stdev(diffs) if len(diffs)>1 else 0
    hw=t(len(diffs)-1)*sd/math.sqrt(len(diffs))
    vo,vn=st.variance(o)/len(o),st.variance(n)/len(n)
    dfw=(vo+vn)**2/((vo**2/(len(o)-1))+(vn**2/(len(n)-1))) if vo+vn>0 else 1
    hw2=t(dfw)*math.sqrt(vo+vn); mw=st.mean(n)-st.mean(o)
    print(f"| {b} | {len(rs)} | {st.median(o):.1f} [{min(o):.1f}-{max(o):.1f}] | {st.median(n):.1f} [{min(n):.1f}-{max(n):.1f}] | {st.median(n)/st.median(o):.3f} | {md:+.1f} [{md-hw:+.1f}, {md+hw:+.1f}] | {mw:+.1f} [{mw-hw2:+.1f}, {mw+hw2:+.1f}] |")
