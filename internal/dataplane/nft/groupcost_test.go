package nft

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// BenchmarkGroupPosition measures what a farm's place in its group chain
// costs a new connection: 16 UDP farms of every port share grp4-0; "tail"
// is the farm whose rule comes last (15 farms' rules are tried before it),
// "head" the one whose rule comes first. Each datagram goes to a new
// destination port, so each is a new conntrack entry and passes the nat
// chains (later packets of a connection would not). The backends drop the
// datagrams at prerouting priority -300. The two take turns in chunks, and
// the CPU of the whole path (testutil.PathCPU) is read around each chunk;
// reported: median ns per new flow for each, and tail - head.
func BenchmarkGroupPosition(b *testing.B) {
	e := newEnv(b, 2, false)
	for _, be := range e.Backends {
		testutil.Run(b, be.Name, "nft", "add table ip sink")
		testutil.Run(b, be.Name, "nft", "add chain ip sink pre { type filter hook prerouting priority -300; policy accept; }")
		testutil.Run(b, be.Name, "nft", "add rule ip sink pre meta l4proto udp counter drop")
	}
	prev := map[string]*model.Farm{}
	var farms []model.Farm
	for i := 1; i <= groupSize; i++ {
		farms = append(farms, e.farm(fmt.Sprintf("g%d", i), testutil.VIP4(i), 0, model.ProtoUDP, 0))
	}
	e.put(b, prev, farms...)
	if g := groupsOf(e.nft(b, "list", "table", "inet", "xlb")); len(g["grp4-0"]) != groupSize {
		b.Fatalf("want %d farms in grp4-0, have %v", groupSize, g)
	}
	// Inserted in order, each at the head: g1's rule is last.
	systems := []struct {
		name string
		send func(port, n int)
	}{
		{"tail", portSender(b, e, testutil.VIP4(1))},
		{"head", portSender(b, e, testutil.VIP4(groupSize))},
	}
	const chunk = 2000
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	per := map[string][]float64{}
	port := 1
	b.ResetTimer()
	for done := 0; done < b.N; done += chunk {
		n := min(chunk, b.N-done)
		if port+n > 65535 {
			b.StopTimer()
			e.flushConntrackB(b)
			port = 1
			b.StartTimer()
		}
		for _, s := range systems {
			c0 := testutil.PathCPU(b)
			s.send(port, n)
			per[s.name] = append(per[s.name], float64(testutil.PathCPU(b)-c0)/float64(n))
		}
		port += n
	}
	b.StopTimer()
	var diff []float64
	for i := range per["tail"] {
		diff = append(diff, per["tail"][i]-per["head"][i])
	}
	b.ReportMetric(medianOf(per["tail"]), "tail-ns/flow")
	b.ReportMetric(medianOf(per["head"]), "head-ns/flow")
	b.ReportMetric(medianOf(diff), "tail-head-ns/flow")
}

func (e *env) flushConntrackB(b *testing.B) {
	b.Helper()
	_, _ = testutil.RunErr(e.LB.Name, "conntrack", "-F")
}

// portSender returns a function that sends n 64-byte datagrams from the
// client to vip, to ports port ... port+n-1, one sendto each, from a plain
// blocking socket: a net.UDPConn would be registered with Go's poller,
// whose wakeups the sender would pay (see the ebpf package's udpSender).
func portSender(b *testing.B, e *env, vip netip.Addr) func(port, n int) {
	fd := -1
	if err := testutil.Do(e.Client.NS, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Close(fd) })
	payload := make([]byte, 64)
	return func(port, n int) {
		for i := range n {
			if err := unix.Sendto(fd, payload, 0, &unix.SockaddrInet4{Port: port + i, Addr: vip.As4()}); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func medianOf(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
