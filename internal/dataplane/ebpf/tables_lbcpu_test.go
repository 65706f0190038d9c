package ebpf

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/nft"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// denyPrefix is the i-th /24 of a deny list: 128.0.0.0/24 onwards (a
// million of them end at 143.255.255.0/24), away from the topology's
// addresses.
func denyPrefix(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(128 + i>>16), byte(i >> 8), byte(i), 0}), 24)
}

// deniedClient is in the list's first prefix.
var deniedClient = netip.MustParseAddr("128.0.0.5")

func denyTable(n int) *model.Table {
	t := model.NewTable("deny", model.TableAddr)
	t.ID, t.Slot, t.Verdict = 1, 1, model.ListDeny
	for i := range n {
		t.PutEntry(model.TableEntry{Key: model.AddrKey(denyPrefix(i))})
	}
	return &t
}

// BenchmarkTablesLBCPU measures what a farm's deny list of n CIDRs costs a
// packet, on each plane, against the same list as a plain nftables named
// set, in one run (ipfw's table rewrite was judged so: forwarding rate,
// stateless and stateful, with and without a list). The path and the CPU
// measurement are BenchmarkLBCPUVeth's: a chain of veth pairs (client --
// LB -- backend), one UDP flow of 64-byte datagrams sent with sendmmsg, the
// backend dropping them at prerouting -300; the systems take turns in
// chunks. Systems (the list is n /24 prefixes; the client is in none):
//
//   - local: sent from the LB namespace to the backend (the baseline);
//   - nft-0, nft-list: the nft plane, dnat, without and with the list as
//     the farm's blacklist policy;
//   - nft-set: the nft plane, dnat without policy, and the list as a plain
//     nftables interval set (`ip saddr @deny drop` at prerouting -110, in
//     a table of its own), what an nftables user would write;
//   - ebpf-0, ebpf-list: this plane, dnat (conntrack), without and with
//     the list as the farm's blacklist; ebpf-0b: a second chain like
//     ebpf-0's, whose ratio to it (ebpf-0b/ebpf-0) is the noise floor of
//     ebpf-list/ebpf-0;
//   - stls-0, stls-list: this plane, stlsdnat (no conntrack), likewise.
//
// And the denied traffic, from an address in the list's first prefix,
// dropped by each: nft-drop (the nft plane's policy), nft-set-drop (the
// plain set), ebpf-drop (the tcx program), xdp-drop (the XDP program in
// native mode on the LB's ingress veth). Transmit checksum offload is off
// on every client (native XDP on veth needs it; the others get the same).
//
// Reported: each system's cpu-ns/pkt (the whole path), lb-ns/pkt (minus
// local's: what the LB adds) for the forwarding systems, and the rate
// ratios of the target: ebpf-list/ebpf-0 and stls-list/stls-0 (the
// packet rate with the list over the rate without: lb-ns without / lb-ns
// with), nft-set/ebpf-list (how many times the plain set's LB cost is
// eBPF's), each a median over chunks. Run with a fixed count (-benchtime
// 100000x); bench/tables.sh runs it several times.
func BenchmarkTablesLBCPU(b *testing.B) {
	testutil.RequireRoot(b)
	for _, n := range []int{1000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) { benchTablesLBCPU(b, n) })
	}
}

type tablesChain struct {
	*xdpChain
	vip, stl netip.AddrPort
	progs    []*ebpf.Program
}

func benchTablesLBCPU(b *testing.B, n int) {
	ctx := context.Background()
	vip := netip.AddrPortFrom(testutil.VIP4(84), 53)
	stl := netip.AddrPortFrom(vip.Addr(), 54)
	list := denyTable(n)
	newChain := func() *tablesChain {
		c := newXDPChain(b, vip.Addr())
		setTxChecksum(b, c.client, "c0", false)
		ch, err := netlink.NewHandleAt(c.client)
		if err != nil {
			b.Fatal(err)
		}
		defer ch.Close()
		l, err := ch.LinkByName("c0")
		if err != nil {
			b.Fatal(err)
		}
		if err := ch.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: deniedClient.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			b.Fatalf("add the denied client's address: %v", err)
		}
		sinkRules(b, c.backendName, 53)
		return &tablesChain{xdpChain: c, vip: vip, stl: stl}
	}
	farmsOf := func(c *tablesChain, policy bool) []*model.Farm {
		be := netip.AddrPortFrom(c.beIP, 53)
		f := farm(b, "udp", vip.Addr().String(), 53, model.ProtoUDP, model.ModeDNAT, model.SchedRR, be.String())
		s := farm(b, "stl", vip.Addr().String(), 54, model.ProtoUDP, model.ModeStlsDNAT, model.SchedHash, be.String())
		if policy {
			f.Policies = []model.PolicyRef{{Name: "deny"}}
			s.Policies = []model.PolicyRef{{Name: "deny"}}
		}
		return []*model.Farm{f, s}
	}
	nftChain := func(tb *model.Table) *tablesChain {
		c := newChain()
		pl, err := nft.New(ctx, testLogger(b), nft.Options{NetNS: c.lb})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { pl.Close() })
		fs := farmsOf(c, tb != nil)
		programTables(b, pl, tb, fs[:1]) // nft: no policies on stlsdnat farms
		return c
	}
	ebpfChain := func(tb *model.Table, xdp XDPMode) *tablesChain {
		c := newChain()
		pl, err := New(ctx, testLogger(b), Options{NetNS: c.lb, PinPath: mountBPFFS(b), ConnTableSize: 16384,
			Interfaces: []string{"lc", "lb"}, XDP: xdp})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { pl.Close() })
		programTables(b, pl, tb, farmsOf(c, tb != nil))
		c.progs = []*ebpf.Program{pl.objs.XlbIngress}
		if xdp != XDPOff {
			c.progs = append(c.progs, pl.objs.XlbXdp)
		}
		return c
	}
	local := newChain()
	nft0, nftList := nftChain(nil), nftChain(list)
	nftSet := nftChain(nil)
	plainSet(b, nftSet.lbName, n)
	ebpf0, ebpfList := ebpfChain(nil, XDPOff), ebpfChain(list, XDPOff)
	// A second chain without the list: how much two like chains differ
	// (the noise floor of ebpf-list/ebpf-0).
	ebpf0b := ebpfChain(nil, XDPOff)
	xdpList := ebpfChain(list, XDPNative)
	be := func(c *tablesChain) netip.AddrPort { return netip.AddrPortFrom(c.beIP, 53) }
	type system struct {
		name  string
		chain *tablesChain
		send  func(int)
		sunk  bool // reaches the backend's sink
	}
	pass := func(name string, c *tablesChain, dst netip.AddrPort) system {
		return system{name, c, udpSender(b, c.client, dst), true}
	}
	drop := func(name string, c *tablesChain) system {
		return system{name, c, udpSenderFrom(b, c.client, deniedClient, c.vip), false}
	}
	systems := []system{
		{"local", local, udpSender(b, local.lb, be(local)), true},
		pass("nft-0", nft0, vip), pass("nft-list", nftList, vip), pass("nft-set", nftSet, vip),
		pass("ebpf-0", ebpf0, vip), pass("ebpf-0b", ebpf0b, vip), pass("ebpf-list", ebpfList, vip),
		pass("stls-0", ebpf0, stl), pass("stls-list", ebpfList, stl),
		drop("nft-drop", nftList), drop("nft-set-drop", nftSet), drop("ebpf-drop", ebpfList), drop("xdp-drop", xdpList),
	}
	sent := map[*tablesChain]int64{}
	for _, s := range systems {
		s.send(1000)
		if s.sunk {
			sent[s.chain] += 1000
		}
	}
	start := map[*tablesChain]int64{}
	for c, want := range sent {
		start[c] = sinkWait(b, c.backendName, want)
		if start[c] != want {
			b.Fatalf("warm-up: the sink counted %d of %d packets", start[c], want)
		}
	}
	st, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		b.Fatalf("enable bpf run time statistics: %v", err)
	}
	defer st.Close()
	// The tcx program's own run time per packet, with and without the
	// list (kernel BPF statistics over all of ebpf-0's / ebpf-list's
	// packets, dnat and stlsdnat).
	runTime := func(c *tablesChain) (float64, float64) {
		ps, err := c.progs[0].Stats()
		if err != nil {
			b.Fatal(err)
		}
		return float64(ps.Runtime), float64(ps.RunCount)
	}
	t0, n0 := runTime(ebpf0)
	t1, n1 := runTime(ebpfList)
	senders := make([]cpuSender, len(systems))
	for i, s := range systems {
		senders[i] = cpuSender{s.name, s.send}
	}
	per := takeTurns(b, senders)
	if t, n := runTime(ebpf0); n > n0 {
		b.ReportMetric((t-t0)/(n-n0), "ebpf-0-bpf-ns/pkt")
	}
	if t, n := runTime(ebpfList); n > n1 {
		b.ReportMetric((t-t1)/(n-n1), "ebpf-list-bpf-ns/pkt")
	}
	for c := range sent {
		k := int64(0)
		for _, s := range systems {
			if s.chain == c && s.sunk {
				k++
			}
		}
		want := start[c] + k*int64(b.N)
		if got := sinkWait(b, c.backendName, want); got != want {
			b.Errorf("the sink counted %d of %d packets", got-start[c], want-start[c])
		}
	}
	// Denied packets must not reach the backend: the sinks above counted
	// exactly the allowed ones.
	for _, s := range systems {
		b.ReportMetric(median(per[s.name]), s.name+"-cpu-ns/pkt")
	}
	lb := func(name string, i int) float64 { return per[name][i] - per["local"][i] }
	ratios := map[string][]float64{}
	for i := range per["local"] {
		for _, s := range []string{"nft-0", "nft-list", "nft-set", "ebpf-0", "ebpf-0b", "ebpf-list", "stls-0", "stls-list"} {
			ratios[s+"-lb-ns/pkt"] = append(ratios[s+"-lb-ns/pkt"], lb(s, i))
		}
		if d := lb("ebpf-0b", i); d > 0 {
			ratios["ebpf-0b/ebpf-0"] = append(ratios["ebpf-0b/ebpf-0"], lb("ebpf-0", i)/d)
		}
		if d := lb("ebpf-list", i); d > 0 {
			ratios["ebpf-list/ebpf-0"] = append(ratios["ebpf-list/ebpf-0"], lb("ebpf-0", i)/d)
			ratios["nft-set/ebpf-list"] = append(ratios["nft-set/ebpf-list"], lb("nft-set", i)/d)
		}
		if d := lb("stls-list", i); d > 0 {
			ratios["stls-list/stls-0"] = append(ratios["stls-list/stls-0"], lb("stls-0", i)/d)
		}
		if d := lb("nft-list", i); d > 0 {
			ratios["nft-list/nft-0"] = append(ratios["nft-list/nft-0"], lb("nft-0", i)/d)
		}
	}
	for name, v := range ratios {
		b.ReportMetric(median(v), name)
	}
	b.ReportMetric(0, "ns/op")
}

// plainSet loads the deny list into namespace ns as a plain nftables
// interval set with a drop rule at prerouting -110 (one nft -f file).
func plainSet(b *testing.B, ns string, n int) {
	path := filepath.Join(b.TempDir(), "deny.nft")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "table ip plain {\n set deny { type ipv4_addr; flags interval; }")
	fmt.Fprintln(w, " chain pre { type filter hook prerouting priority -110; policy accept; ip saddr @deny drop; }\n}")
	const chunk = 10000
	for i := 0; i < n; i += chunk {
		fmt.Fprint(w, "add element ip plain deny {")
		for j := i; j < min(n, i+chunk); j++ {
			if j > i {
				fmt.Fprint(w, ",")
			}
			fmt.Fprint(w, denyPrefix(j))
		}
		fmt.Fprintln(w, "}")
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	f.Close()
	testutil.Run(b, ns, "nft", "-f", path)
}

// programTables applies the table (if any, with the farms attaching it) and
// the farms to a plane.
func programTables(b *testing.B, dp dataplane.Dataplane, tb *model.Table, farms []*model.Farm) {
	ctx := context.Background()
	if tb != nil {
		d := created(tb)
		for _, f := range farms {
			d.Farms = append(d.Farms, plan.FarmChange{New: f})
		}
		if err := dp.(dataplane.TablePlane).ApplyTables(ctx, d); err != nil {
			b.Fatalf("apply the deny list: %v", err)
		}
	}
	if err := dp.Reconcile(ctx, farms); err != nil {
		b.Fatal(err)
	}
}
