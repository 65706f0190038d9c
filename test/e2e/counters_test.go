package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestCountersExactAcrossRestart: exactly n datagrams of one UDP flow
// through a farm, each answered, raise every traffic counter the daemon
// shows by exactly what was sent, on each data plane: in /metrics the
// farm's and the serving backend's connections (1), packets in and out
// (n), bytes in and out (the IP lengths), the other backends' nothing; the
// same in `xlb list --stats`. The daemon is then killed (-9) and started
// again (a hitless restart: the kernel's counters stay): the counts are
// the same, and n more datagrams raise them by exactly n again.
func TestCountersExactAcrossRestart(t *testing.T) {
	for _, plane := range []string{"nft", "ebpf"} {
		t.Run(plane, func(t *testing.T) {
			var e *lbEnv
			if plane == "ebpf" {
				e, _ = newEBPFEnv(t, "--metrics-listen", metricsAddr)
			} else {
				e = newEnvWith(t, []string{"--metrics-listen", metricsAddr})
			}
			for i, b := range e.topo.Backends {
				testutil.StartUDPServer(t, b.NS, netip.AddrPortFrom(b.IPv4, 8053), fmt.Sprintf("backend-%d", i+1))
			}
			vip := netip.AddrPortFrom(testutil.VIP4(31), 53)
			e.mustCLI("farm", "add", "dns", "--vip", vip.Addr().String(), "--ports", "53", "--proto", "udp", "--mode", "snat", "--sched", "rr")
			for i, b := range e.topo.Backends {
				e.mustCLI("backend", "add", "dns", fmt.Sprintf("be%d", i+1), "--ip", b.IPv4.String(), "--port", "8053")
			}
			const n = 50
			families := []string{"connections_total", "incoming_packets_total", "outgoing_packets_total", "incoming_bytes_total", "outgoing_bytes_total"}
			read := func() map[string]float64 {
				body := e.scrape()
				m := map[string]float64{}
				for _, fam := range families {
					m["farm "+fam] = metricSum(t, body, "xlb_farm_"+fam, `farm="dns"`)
					for i := range e.topo.Backends {
						be := fmt.Sprintf("be%d", i+1)
						m[be+" "+fam] = metricSum(t, body, "xlb_backend_"+fam, `farm="dns"`, `backend="`+be+`"`)
					}
				}
				return m
			}
			check := func(what string, before, after map[string]float64, served string, in, out uint64) {
				t.Helper()
				want := map[string]float64{"connections_total": 1, "incoming_packets_total": n, "outgoing_packets_total": n,
					"incoming_bytes_total": float64(in), "outgoing_bytes_total": float64(out)}
				for k, v := range after {
					who, fam, _ := strings.Cut(k, " ")
					w := 0.0
					if who == "farm" || who == served {
						w = want[fam]
					}
					if got := v - before[k]; got != w {
						t.Errorf("%s: %s rose by %v, want %v (%s served)", what, k, got, w, served)
					}
				}
			}
			// The daemon serves the rate estimator's last read of the
			// counters (every 2 s): wait for one that has the flow.
			readAfter := func(before map[string]float64) map[string]float64 {
				t.Helper()
				var m map[string]float64
				for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
					if m = read(); m["farm incoming_packets_total"]-before["farm incoming_packets_total"] >= n {
						break
					}
				}
				return m
			}
			m0 := read()
			served, in, out := udpFlowE2E(t, e, vip, n)
			m1 := readAfter(m0)
			check("first flow", m0, m1, served, in, out)
			// xlb list --stats: the farm line's packets in and out.
			stats := e.mustCLI("list", "-n", "--stats")
			if !strings.Contains(stats, fmt.Sprintf("UDP  %s ", vip)) {
				t.Errorf("xlb list --stats has no line for %s:\n%s", vip, stats)
			}
			for _, l := range strings.Split(stats, "\n") {
				if f := strings.Fields(l); len(f) == 7 && f[0] == "UDP" && f[1] == vip.String() {
					if f[2] != "1" || f[3] != fmt.Sprint(n) || f[4] != fmt.Sprint(n) {
						t.Errorf("xlb list --stats farm line %q: want 1 connection, %d packets in and out", l, n)
					}
				}
			}

			e.kill()
			e.start()
			m2 := read()
			for k, v := range m1 {
				if m2[k] != v {
					t.Errorf("after the restart %s = %v, before it %v", k, m2[k], v)
				}
			}
			served2, in2, out2 := udpFlowE2E(t, e, vip, n)
			check("a flow after the restart", m2, readAfter(m2), served2, in2, out2)
		})
	}
}

// udpFlowE2E sends n datagrams of one flow to addr from the client
// namespace, each answered, and returns the backend that answered and the
// IP bytes sent and received.
func udpFlowE2E(t *testing.T, e *lbEnv, addr netip.AddrPort, n int) (string, uint64, uint64) {
	t.Helper()
	var c *net.UDPConn
	if err := testutil.Do(e.topo.Client.NS, func() error {
		var err error
		c, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const ipUDP = 20 + 8
	payload := []byte("counted datagram")
	buf := make([]byte, 2048)
	var in, out uint64
	served := ""
	for i := range n {
		c.SetDeadline(time.Now().Add(testutil.DefaultTimeout))
		if _, err := c.Write(payload); err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		m, err := c.Read(buf)
		if err != nil {
			t.Fatalf("answer to datagram %d: %v", i, err)
		}
		name, _, _ := strings.Cut(string(buf[:m]), " ")
		if served != "" && name != served {
			t.Fatalf("one flow answered by %s and %s", served, name)
		}
		served = name
		in += uint64(len(payload) + ipUDP)
		out += uint64(m + ipUDP)
	}
	// backend-2 answers for be2.
	return "be" + strings.TrimPrefix(served, "backend-"), in, out
}
