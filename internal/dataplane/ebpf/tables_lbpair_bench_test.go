package ebpf

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// BenchmarkTablesLBPair is the ratio through the LB (the packet
// rate with a deny list of n CIDRs against the rate without it) measured
// on one chain: BenchmarkTablesLBCPU compares two chains (two namespaces,
// two pairs of veths, two planes), whose difference alone moves the ratio
// by 0.93-1.14 (its ebpf-0b/ebpf-0), more than the list's effect. Here one
// plane serves four farms on one VIP, each to the same backend: stlsdnat
// with the list as its blacklist (port 54) and without a policy (55), dnat
// likewise (53 and 56). The client is in no entry. The systems take turns
// in chunks of lbcpuChunk, each pair's order alternating by chunk, so the
// two sides of a ratio differ by the farm's policy only.
//
// Reported, medians over chunks: each system's cpu-ns/pkt (the whole
// path: the client's send, the LB, the backend's sink, as
// BenchmarkLBCPUVeth measures it), and per chunk pair the rate ratios
// stls-path and dnat-path (cpu without / cpu with: packets a second of
// the whole path) and stls-lb and dnat-lb (the same minus local's cost,
// a chain without LB measured in the same turns: what the LB's own work
// gives). bench/results/stateless-ab.md runs it several times and takes
// the 95 % interval over runs.
func BenchmarkTablesLBPair(b *testing.B) {
	testutil.RequireRoot(b)
	for _, n := range []int{1000, 1_000_000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) { benchTablesLBPair(b, n) })
	}
}

func benchTablesLBPair(b *testing.B, n int) {
	ctx := context.Background()
	vip := testutil.VIP4(85)
	local := newXDPChain(b, vip)
	sinkRules(b, local.backendName, 53)
	c := newXDPChain(b, vip)
	sinkRules(b, c.backendName, 53)
	pl, err := New(ctx, testLogger(b), Options{NetNS: c.lb, PinPath: mountBPFFS(b), ConnTableSize: 16384,
		Interfaces: []string{"lc", "lb"}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pl.Close() })
	// The LB's farms, on one VIP, each to the backend's port 53 (the
	// sink's). Stateless farms cannot share a backend (their replies could
	// not be told apart): each has an address of its own on the backend.
	// No farm listens on port 53 itself: the whole path of packets sent to
	// VIP:53 measured about 100 ns more than to other ports, with the same
	// program time and with or without a policy (not explained; outside
	// the program).
	type lbFarm struct {
		name string
		port uint16
		mode model.Mode
		list bool
	}
	lbFarms := []lbFarm{
		{"dnat-list", 56, model.ModeDNAT, true},
		{"dnat-0", 58, model.ModeDNAT, false},
		{"stls-list", 54, model.ModeStlsDNAT, true},
		{"stls-0", 55, model.ModeStlsDNAT, false},
		{"stls-0b", 57, model.ModeStlsDNAT, false},
	}
	systems := []cpuSender{{"local", udpSender(b, local.lb, netip.AddrPortFrom(local.beIP, 53))}}
	var farms []*model.Farm
	be := c.beIP
	for _, lf := range lbFarms {
		sched := model.SchedRR
		if lf.mode == model.ModeStlsDNAT {
			sched = model.SchedHash
			be = be.Next()
			testutil.Run(b, c.backendName, "ip", "addr", "add", be.String()+"/24", "dev", "b0")
		}
		f := farm(b, lf.name, vip.String(), lf.port, model.ProtoUDP, lf.mode, sched, netip.AddrPortFrom(be, 53).String())
		if lf.list {
			f.Policies = []model.PolicyRef{{Name: "deny"}}
		}
		farms = append(farms, f)
		systems = append(systems, cpuSender{lf.name, udpSender(b, c.client, netip.AddrPortFrom(vip, lf.port))})
	}
	programTables(b, pl, denyTable(n), farms)
	lbSystems := len(lbFarms)
	// The tcx program's own time per packet of each system: kernel BPF
	// statistics around its sends (only its packets run the program then).
	st, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		b.Fatalf("enable bpf run time statistics: %v", err)
	}
	defer st.Close()
	bpfTime := map[string]*[2]float64{}
	for i, s := range systems[1:] {
		t := new([2]float64)
		bpfTime[s.name] = t
		send := s.send
		systems[1+i].send = func(n int) {
			s0, err := pl.objs.XlbIngress.Stats()
			if err != nil {
				b.Fatal(err)
			}
			send(n)
			s1, err := pl.objs.XlbIngress.Stats()
			if err != nil {
				b.Fatal(err)
			}
			t[0] += float64(s1.Runtime - s0.Runtime)
			t[1] += float64(s1.RunCount - s0.RunCount)
		}
	}
	for _, s := range systems {
		s.send(1000)
	}
	if got := sinkWait(b, local.backendName, 1000); got != 1000 {
		b.Fatalf("warm-up: local's sink counted %d of 1000 packets", got)
	}
	if got := sinkWait(b, c.backendName, int64(lbSystems)*1000); got != int64(lbSystems)*1000 {
		b.Fatalf("warm-up: the sink counted %d of %d packets (a farm did not forward)", got, lbSystems*1000)
	}
	per := takeTurnsAlternating(b, systems, true)
	want := int64(lbSystems) * int64(1000+b.N)
	if got := sinkWait(b, c.backendName, want); got != want {
		b.Errorf("the sink counted %d of %d packets", got, want)
	}
	for _, s := range systems {
		b.ReportMetric(median(per[s.name]), s.name+"-cpu-ns/pkt")
	}
	for name, t := range bpfTime {
		if t[1] > 0 {
			b.ReportMetric(t[0]/t[1], name+"-bpf-ns/pkt")
		}
	}
	ratios := map[string][]float64{}
	for i := range per["local"] {
		for _, m := range []string{"stls", "dnat"} {
			off, on, base := per[m+"-0"][i], per[m+"-list"][i], per["local"][i]
			ratios[m+"-path"] = append(ratios[m+"-path"], off/on)
			if on > base {
				ratios[m+"-lb"] = append(ratios[m+"-lb"], (off-base)/(on-base))
			}
		}
		// Two farms alike (the noise floor of the ratios above).
		ratios["stls-aa-path"] = append(ratios["stls-aa-path"], per["stls-0b"][i]/per["stls-0"][i])
	}
	for name, v := range ratios {
		b.ReportMetric(median(v), name)
	}
	b.ReportMetric(0, "ns/op")
}
