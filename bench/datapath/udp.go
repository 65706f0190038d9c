package main

import (
	"context"
	"fmt"
	"github.com/xlb-lb/xlb/bench/internal/topo"
	"net"
	"os"
	"regexp"
	"strconv"
	"time"
)

// The udp load measures packets per second: a light generator in the client
// namespace (this program, re-executed as `datapath udpgen`) sends small
// datagrams over a fixed set of flows to the VIP, and every backend drops them
// in an nftables rule at prerouting priority -300 (before conntrack), counting
// them: a sink that costs the backend almost nothing. Packets/s is what the
// sinks counted divided by the time the generator sent; sent minus counted is
// the loss.
const (
	udpPort  = 5353
	udpFlows = 64 // source ports; each flow is scheduled once, then forwarded by conntrack
)

// sinkRules is the ruleset of every backend namespace when the udp load runs.
var sinkRules = fmt.Sprintf(`table ip sink {
	chain pre {
		type filter hook prerouting priority -300; policy accept;
		udp dport %d counter drop
	}
}
`, udpPort)

var reCounter = regexp.MustCompile(`counter packets (\d+)`)

// sinkCounts returns the packets each backend's sink dropped so far.
func sinkCounts(ctx context.Context, t *topo.Topology) ([]float64, error) {
	var n []float64
	for i := range topo.Backends {
		out, err := t.Output(ctx, fmt.Sprintf("be%d", i+1), "nft", "list", "table", "ip", "sink")
		if err != nil {
			return nil, err
		}
		m := reCounter.FindSubmatch(out)
		if m == nil {
			return nil, fmt.Errorf("no counter in the sink of be%d:\n%s", i+1, out)
		}
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		n = append(n, v)
	}
	return n, nil
}

// udpTarget is where the generator sends for system s.
func (s *system) udpTarget() string {
	if s.name == "direct" {
		return fmt.Sprintf("%s:%d", topo.Backends[0], udpPort)
	}
	return fmt.Sprintf("%s:%d", topo.VIP, udpPort)
}

// hasUDP says whether system s balances UDP (HAProxy is a TCP/HTTP proxy).
func (s *system) hasUDP() bool { return s.name != "haproxy" }

// udpLoad checks that new UDP flows reach every backend they should, then
// runs the generator for d and returns packets/s and loss.
func udpLoad(ctx context.Context, t *topo.Topology, s *system, d time.Duration) (sample, error) {
	gen := func(flows, count int, d time.Duration) (float64, float64, error) {
		self, err := os.Executable()
		if err != nil {
			return 0, 0, err
		}
		out, err := t.Output(ctx, "client", self, "udpgen", s.udpTarget(), strconv.Itoa(flows), strconv.Itoa(count), d.String())
		if err != nil {
			return 0, 0, err
		}
		var sent, secs float64
		if _, err := fmt.Sscan(string(out), &sent, &secs); err != nil {
			return 0, 0, fmt.Errorf("udpgen output %q: %w", out, err)
		}
		return sent, secs, nil
	}
	// The check: 30 new flows of one packet each.
	before, err := sinkCounts(ctx, t)
	if err != nil {
		return sample{}, err
	}
	var after []float64
	want := len(topo.Backends)
	if s.name == "direct" {
		want = 1
	}
	for range 20 { // the packets are counted within a moment; wait that moment
		if _, _, err := gen(30, 30, time.Second); err != nil {
			return sample{}, fmt.Errorf("udpgen: %w", err)
		}
		if after, err = sinkCounts(ctx, t); err != nil {
			return sample{}, err
		}
		got := 0
		for i := range after {
			if after[i] > before[i] {
				got++
			}
		}
		if got >= want {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	got := 0
	for i := range after {
		if after[i] > before[i] {
			got++
		}
	}
	if got < want {
		return sample{}, fmt.Errorf("check: new UDP flows to %s reached %d backends, want %d (sinks before %v, after %v)", s.udpTarget(), got, want, before, after)
	}

	before = after
	// Bound: at most 3 million packets per second of run, whatever happens.
	sent, secs, err := gen(udpFlows, int(3e6*d.Seconds()), d)
	if err != nil {
		return sample{}, fmt.Errorf("udpgen: %w", err)
	}
	time.Sleep(200 * time.Millisecond) // let queued packets reach the sinks
	if after, err = sinkCounts(ctx, t); err != nil {
		return sample{}, err
	}
	var recv float64
	for i := range after {
		recv += after[i] - before[i]
	}
	if recv == 0 || secs == 0 {
		return sample{}, fmt.Errorf("udp: no packet reached the sinks through %s (%.0f sent)", s.udpTarget(), sent)
	}
	return sample{
		ReqPerSec: recv / secs, Requests: recv, DurationMs: secs * 1000,
		Sent: sent, LossPct: 100 * (sent - recv) / sent,
	}, nil
}

// udpgen is the generator, run in the client namespace as
// `datapath udpgen ADDR:PORT FLOWS COUNT DURATION`: it sends 18-byte datagrams
// (64-byte frames) round robin over FLOWS connected sockets until COUNT
// packets or DURATION, whichever comes first, and prints "sent seconds".
// Send errors (a full queue) are not counted as sent.
func udpgen(args []string) error {
	if len(args) != 4 {
		return fmt.Errorf("usage: datapath udpgen ADDR:PORT FLOWS COUNT DURATION")
	}
	flows, err1 := strconv.Atoi(args[1])
	count, err2 := strconv.Atoi(args[2])
	d, err3 := time.ParseDuration(args[3])
	if err1 != nil || err2 != nil || err3 != nil || flows < 1 || count < 1 || d <= 0 || d > time.Minute {
		return fmt.Errorf("udpgen: bad arguments %q", args)
	}
	conns := make([]net.Conn, flows)
	for i := range conns {
		c, err := net.Dial("udp4", args[0])
		if err != nil {
			return fmt.Errorf("udpgen: %w", err)
		}
		defer c.Close()
		conns[i] = c
	}
	payload := make([]byte, 18)
	start := time.Now()
	deadline := start.Add(d)
	sent := 0
	for i := 0; i < count; i++ {
		if i%256 == 0 && time.Now().After(deadline) {
			break
		}
		if _, err := conns[i%flows].Write(payload); err == nil {
			sent++
		}
	}
	fmt.Println(sent, time.Since(start).Seconds())
	return nil
}
