#!/usr/bin/env python3
# The stateless check's cost in the program's own terms, per run: list=none ns / list=N ns and
# list=N - list=none, pooled over the files PREFIX-old.txt and PREFIX-new.txt of each
# PREFIX given (e.g. bench/results/stateless-ab/ab1 ab2: see stateless-ab.md). 95 % interval: Student's t over the runs.
import re,sys,statistics as st,math
T={1:12.706,2:4.303,3:3.182,4:2.776,5:2.571,6:2.447,7:2.365,8:2.306,9:2.262,10:2.228,11:2.201,12:2.179,13:2.160,14:2.145,15:2.131}
def runs(paths):
    out=[]
    for path in paths:
        cur={}
        for l in open(path):
            m=re.match(r'BenchmarkTablesStateless/list=(\w+)-2\s+\d+\s+\d+ ns/op\s+([\d.]+) ns/pkt', l.strip())
            if not m: continue
            cur[m.group(1)]=float(m.group(2))
            if m.group(1)=='1000000': out.append(cur);cur={}
    return out
for w in ['old','new']:
    rs=runs([d+'-%s.txt'%w for d in sys.argv[1:]])
    n=len(rs)
    for lst in ['0','1000','1000000']:
        ratios=[r['none']/r[lst] for r in rs]
        m=st.mean(ratios); sd=st.stdev(ratios); h=T[n-1]*sd/math.sqrt(n)
        d=[r[lst]-r['none'] for r in rs]
        print('%s list=%s runs %d: ratio none/list median %.3f (min %.3f max %.3f), mean %.3f ± %.3f (95%%, t); extra ns median %.1f, mean %.1f ± %.1f'%(w,lst,n,st.median(ratios),min(ratios),max(ratios),m,h,st.median(d),st.mean(d),T[n-1]*st.stdev(d)/math.sqrt(n)))
