package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// api sends one request to the daemon's API from inside the LB namespace.
func (e *lbEnv) api(method, path, body string) (int, string) {
	e.t.Helper()
	req, err := http.NewRequest(method, "http://127.0.0.1:5555"+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Key", testKey)
	resp, err := testutil.HTTPClient(e.topo.LB.NS).Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// deniedAddr is the client's i-th extra address, 10.100.0.(100+i): an
// address of the client's own subnet, so the client can send from it.
func deniedAddr(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 100, 0, byte(100 + i)}) }

// Table changes survive kill -9 as farm changes do: a daemon killed while
// entries are being added one a change loses none it acknowledged (each is
// in the saved state after the restart and filters traffic), and the
// filtering never stops: a client in the deny list is refused throughout,
// with the daemon down and while it restarts.
func TestTableChangesSurviveKill9(t *testing.T) {
	for _, plane := range []string{"nft", "ebpf"} {
		t.Run(plane, func(t *testing.T) {
			var e *lbEnv
			if plane == "ebpf" {
				e, _ = newEBPFEnv(t)
			} else {
				e = newEnv(t)
			}
			testTableKill9(t, e)
		})
	}
}

func testTableKill9(t *testing.T, e *lbEnv) {
	vip := netip.AddrPortFrom(testutil.VIP4(31), 80)
	e.addWebFarm(vip.Addr())
	e.mustCLI("table", "create", "bl", "type", "addr", "verdict", "deny")
	if code, out := e.api("POST", "/farms/web/policies", `{"policies":[{"name":"bl"}]}`); code != 200 {
		t.Fatalf("attach bl to web: %d %s", code, out)
	}
	const max = 120
	for i := range max {
		e.topo.Client.AddAddr(t, netip.PrefixFrom(deniedAddr(i), 24))
	}
	e.mustCLI("table", "bl", "add", deniedAddr(0).String())
	e.requireAllBackends(vip, 9)
	refused := func(from netip.Addr) bool {
		c, err := testutil.DialTCPFrom(e.topo.Client.NS, netip.AddrPortFrom(from, 0), vip, 150*time.Millisecond)
		if err != nil {
			return true
		}
		defer c.Close()
		_, err = testutil.ReadLine(c, 150*time.Millisecond)
		return err != nil
	}
	if !refused(deniedAddr(0)) {
		t.Fatal("a client in the deny list was served before the test began")
	}

	// The probe: the denied client tries all along; any answer is a gap.
	var stop atomic.Bool
	var gaps, probes atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			probes.Add(1)
			if !refused(deniedAddr(0)) {
				gaps.Add(1)
			}
		}
	}()

	// The writer: one entry a change, as fast as the CLI goes; the daemon
	// is killed under it after some acknowledgements.
	acked := 0
	var werr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; i < max; i++ {
			if _, err := e.cli("table", "bl", "add", deniedAddr(i).String()); err != nil {
				werr = err
				return
			}
			acked = i
		}
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, _ := e.cli("table", "bl", "info")
		if countEntries(out) >= 30 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.kill()
	<-done
	if werr == nil {
		t.Fatalf("the writer finished all %d entries before the kill: nothing was tested", max)
	}
	time.Sleep(300 * time.Millisecond) // no daemon: the kernel filters alone
	e.start()
	time.Sleep(300 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if gaps.Load() > 0 {
		t.Errorf("the denied client was served %d times of %d tries across kill -9 and restart", gaps.Load(), probes.Load())
	}
	if acked < 10 {
		t.Fatalf("only %d entries acknowledged before the kill", acked)
	}
	list := e.mustCLI("table", "bl", "list")
	for i := 0; i <= acked; i++ {
		if !strings.Contains(list, deniedAddr(i).String()+"\n") && !strings.Contains(list, deniedAddr(i).String()+" ") {
			t.Errorf("acknowledged entry %s lost after kill -9 (last acknowledged %s):\n%s", deniedAddr(i), deniedAddr(acked), list)
		}
	}
	// The kernel has them: the first, a middle and the last acknowledged
	// clients are refused; a client not listed is served.
	for _, i := range []int{1, acked / 2, acked} {
		if !refused(deniedAddr(i)) {
			t.Errorf("acknowledged entry %s is not enforced after the restart", deniedAddr(i))
		}
	}
	e.requireAllBackends(vip, 9)
	t.Logf("%d entries acknowledged before kill -9; %d probes of the denied client, none served", acked, probes.Load())
}

// countEntries reads the entry count from `xlb table NAME info` (" items: N, limit: ...").
func countEntries(info string) int {
	_, rest, ok := strings.Cut(info, "items: ")
	if !ok {
		return 0
	}
	var n int
	fmt.Sscan(strings.TrimSpace(strings.SplitN(rest, ",", 2)[0]), &n)
	return n
}
