package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// askWithin tries new connections through addr, each given 150 ms, until
// one is answered or d has passed; it returns how long that took.
func (e *lbEnv) askWithin(addr netip.AddrPort, d time.Duration) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < d {
		c, err := testutil.DialTCP(e.topo.Client.NS, addr, 150*time.Millisecond)
		if err == nil {
			_, err = testutil.ReadLine(c, 150*time.Millisecond)
			c.Close()
			if err == nil {
				return time.Since(start), true
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start), false
}

// nft runs nft in the LB namespace.
func (e *lbEnv) nft(args ...string) string {
	e.t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", e.topo.LB.Name, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		e.t.Fatalf("nft %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// tableOf returns the inet table of xlb's that holds vip.
func tableOf(t *testing.T, listing string, vip netip.Addr) string {
	t.Helper()
	re := regexp.MustCompile(`(?m)^table inet (xlb-[0-9a-f]{2}) \{`)
	locs := re.FindAllStringSubmatchIndex(listing, -1)
	for i, l := range locs {
		end := len(listing)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		if strings.Contains(listing[l[0]:end], vip.String()+" . tcp . 80") {
			return listing[l[2]:l[3]]
		}
	}
	t.Fatalf("no table of xlb's holds %s:\n%s", vip, listing)
	return ""
}

// mapOf returns the name of the map whose element sends vip:80 to its
// farm.
func mapOf(t *testing.T, listing string, vip netip.Addr) string {
	t.Helper()
	re := regexp.MustCompile(`(?m)^\tmap (\w+) \{`)
	locs := re.FindAllStringSubmatchIndex(listing, -1)
	for i, l := range locs {
		end := len(listing)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		if strings.Contains(listing[l[0]:end], vip.String()+" . tcp . 80 :") {
			return listing[l[2]:l[3]]
		}
	}
	t.Fatalf("no map sends %s to its farm:\n%s", vip, listing)
	return ""
}

// Changes made to xlb's tables by another program while the daemon runs
// are repaired within a second, without a restart: the ruleset flushed, a
// base chain emptied, the VIP's map element deleted, the farm's table
// deleted. A change made right after the drift is acknowledged only once
// it (and the rest) carries traffic. Before, only a restart repaired,
// and a farm added meanwhile was acknowledged without carrying traffic.
func TestDriftRepairedWhileRunning(t *testing.T) {
	e := newEnv(t)
	vip := netip.AddrPortFrom(testutil.VIP4(6), 80)
	e.addWebFarm(vip.Addr())
	e.requireAllBackends(vip, 9)
	listing := e.nftList()
	table := tableOf(t, listing, vip.Addr())
	svcMap := mapOf(t, listing, vip.Addr())
	for _, c := range []struct {
		name   string
		tamper []string
	}{
		{"nft flush ruleset", []string{"flush", "ruleset"}},
		{"prerouting chain emptied", []string{"flush", "chain", "inet", table, "prerouting"}},
		{"VIP's map element deleted", []string{"delete", "element", "inet", table, svcMap, "{ " + vip.Addr().String() + " . tcp . 80 }"}},
		{"farm's table deleted", []string{"delete", "table", "inet", table}},
	} {
		e.nft(c.tamper...)
		took, ok := e.askWithin(vip, time.Second)
		if !ok {
			t.Fatalf("%s: no traffic within a second; kernel:\n%s", c.name, e.nftList())
		}
		t.Logf("%s: traffic back after %s", c.name, took.Round(time.Millisecond))
		e.requireAllBackends(vip, 9)
	}

	// A change right after the drift: no wait between the two.
	sh := exec.Command("ip", "netns", "exec", e.topo.LB.Name, "sh", "-c",
		"nft flush ruleset && "+e.bin+" farm add api --vip "+testutil.VIP4(7).String()+" --ports 80 --proto tcp --mode snat && "+
			e.bin+" backend add api be1 --ip "+e.topo.Backends[0].IPv4.String()+" --port 8080")
	sh.Env = append(os.Environ(), "XLB_KEY="+testKey, "XLB_API=http://127.0.0.1:5555")
	if out, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("flush, then a change at once: %v: %s", err, out)
	}
	// Acknowledged: it carries traffic now, as does the farm before it.
	api := netip.AddrPortFrom(testutil.VIP4(7), 80)
	if _, err := testutil.AskTCP(e.topo.Client.NS, api); err != nil {
		t.Fatalf("the farm added right after the flush was acknowledged but carries no traffic: %v", err)
	}
	if _, err := testutil.AskTCP(e.topo.Client.NS, vip); err != nil {
		t.Fatalf("the farm before the flush carries no traffic after the next change: %v", err)
	}

	out := e.mustCLI("reconcile")
	m := regexp.MustCompile(`drift watch yes: (\d+) changes by other programs seen, (\d+) repaired`).FindStringSubmatch(out)
	if m == nil || atoi(m[1]) < 5 || atoi(m[2]) == 0 {
		t.Errorf("xlb reconcile: %s", out)
	}
	log, _ := os.ReadFile(e.logFile)
	if n := strings.Count(string(log), "kernel drift repaired"); n < 5 {
		t.Errorf("%d repairs logged, want at least 5", n)
	}
	// The change right after the flush found the drift itself (the
	// watch's repair waits for the changes to settle).
	if !strings.Contains(string(log), "trigger=change") {
		t.Errorf("no repair before a change was acknowledged:\n%s", log)
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// On the eBPF plane: the program detached from an interface, a link's
// pin removed, a service entry or a backend deleted from the pinned maps
// by another program (bpftool, a script) are repaired within a second,
// without a restart.
func TestEBPFDriftRepairedWhileRunning(t *testing.T) {
	e, pin := newEBPFEnv(t)
	vip := netip.AddrPortFrom(testutil.VIP4(23), 80)
	e.addWebFarm(vip.Addr())
	e.requireAllBackends(vip, 9)
	ifname := e.topo.LB.Link
	for i, c := range []struct {
		name   string
		tamper func() error
	}{
		{"program detached", func() error {
			id, _ := linkProgram(t, pin, ifname)
			l, err := link.NewFromID(link.ID(id))
			if err != nil {
				return err
			}
			defer l.Close()
			return l.Detach()
		}},
		{"link pin removed and link detached", func() error {
			id, _ := linkProgram(t, pin, ifname)
			if err := os.Remove(filepath.Join(pin, "link_ingress_"+ifname)); err != nil {
				return err
			}
			l, err := link.NewFromID(link.ID(id))
			if err != nil {
				return err
			}
			defer l.Close()
			return l.Detach()
		}},
		{"service entries deleted", func() error { return deleteAll(filepath.Join(pin, "xlb_services")) }},
		{"backends deleted", func() error { return deleteAll(filepath.Join(pin, "xlb_backends")) }},
	} {
		if err := c.tamper(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		took, ok := e.askWithin(vip, time.Second)
		if !ok {
			t.Fatalf("%s: no traffic within a second", c.name)
		}
		t.Logf("%s: traffic back after %s", c.name, took.Round(time.Millisecond))
		e.requireAllBackends(vip, 9)
		// Traffic flows once the link is attached again; the repair
		// then pins it and finishes: the next case starts after that.
		e.waitLog(fmt.Sprintf("repair %d done", i+1), func(log string) bool {
			return strings.Count(log, "kernel drift repaired") >= i+1
		})
	}
	out := e.mustCLI("reconcile")
	m := regexp.MustCompile(`drift watch yes: (\d+) changes by other programs seen, (\d+) repaired`).FindStringSubmatch(out)
	if m == nil || atoi(m[2]) < 4 {
		t.Errorf("xlb reconcile: %s", out)
	}
}

// deleteAll deletes every entry of the pinned map at path.
func deleteAll(path string) error {
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return err
	}
	defer m.Close()
	var keys [][]byte
	k := make([]byte, m.KeySize())
	v := make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, append([]byte(nil), k...))
	}
	if err := it.Err(); err != nil {
		return err
	}
	if len(keys) == 0 {
		return fmt.Errorf("%s: no entry to delete", path)
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// waitLog waits up to 5 s until the daemon's log satisfies ok.
func (e *lbEnv) waitLog(what string, ok func(log string) bool) {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(e.logFile)
		if ok(string(b)) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after 5s waiting for %s in the daemon's log", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
