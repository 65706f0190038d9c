package e2e

import (
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// xlbTCX lists the xlb programs attached at tcx ingress in the LB
// namespace.
func (e *lbEnv) xlbTCX() []string {
	e.t.Helper()
	var out []string
	err := testutil.Do(e.topo.LB.NS, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			res, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: ebpf.AttachTCXIngress})
			if err != nil {
				continue
			}
			for _, p := range res.Programs {
				prog, err := ebpf.NewProgramFromID(p.ID)
				if err != nil {
					continue
				}
				info, err := prog.Info()
				prog.Close()
				if err == nil && strings.HasPrefix(info.Name, "xlb_") {
					out = append(out, l.Attrs().Name+": "+info.Name)
				}
			}
		}
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// pins lists what is pinned under pin ("" if the directory is gone).
func pins(t *testing.T, pin string) string {
	t.Helper()
	entries, err := os.ReadDir(pin)
	if os.IsNotExist(err) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return strings.Join(names, " ")
}

// A daemon moved from the eBPF plane to nft removes the eBPF program and
// its pins once nft holds the farms: a farm deleted through the API then
// stops serving. Before, the program stayed attached with its last farms
// and kept serving the deleted farm.
func TestPlaneSwitchEBPFToNft(t *testing.T) {
	e, pin := newEBPFEnv(t)
	vip := netip.AddrPortFrom(testutil.VIP4(24), 80)
	e.addWebFarm(vip.Addr())
	e.requireAllBackends(vip, 9)
	e.kill()
	e.args = []string{"--pin-path", pin} // nft, told where the eBPF plane pinned
	e.start()
	e.requireAllBackends(vip, 9) // served by nft now
	if got := e.xlbTCX(); len(got) != 0 {
		t.Fatalf("the eBPF program is still attached after the switch to nft: %v", got)
	}
	if got := pins(t, pin); got != "" {
		t.Errorf("pins left after the switch to nft: %s", got)
	}
	if log, _ := os.ReadFile(e.logFile); !strings.Contains(string(log), "removed the other data plane's objects") {
		t.Errorf("the removal is not logged:\n%s", log)
	}
	e.mustCLI("farm", "del", "web")
	if reply, err := testutil.AskTCP(e.topo.Client.NS, vip); err == nil {
		t.Fatalf("the farm deleted after the switch to nft still answers: %q", reply)
	}
}

// A daemon moved from nft to the eBPF plane removes xlb's nft tables once
// the eBPF plane holds the farms: a farm deleted through the API stops
// serving.
func TestPlaneSwitchNftToEBPF(t *testing.T) {
	e := newEnv(t)
	vip := netip.AddrPortFrom(testutil.VIP4(25), 80)
	e.addWebFarm(vip.Addr())
	// The named tables' nft table stays once made (the eBPF plane keeps
	// no named tables yet: the saved state must hold none).
	e.mustCLI("table", "create", "bad", "type", "addr", "verdict", "deny")
	e.mustCLI("table", "bad", "destroy")
	e.requireAllBackends(vip, 9)
	if !strings.Contains(e.nftList(), "table inet xlb-tables") {
		t.Fatalf("no named tables' table to leave behind:\n%s", e.nftList())
	}
	e.kill()
	e.args = []string{"--dataplane", "ebpf", "--pin-path", mountBPFFS(t), "--conn-table-size", "4096"}
	e.start()
	e.requireAllBackends(vip, 9) // served by eBPF now
	if got := e.nftList(); strings.Contains(got, "xlb") {
		t.Fatalf("xlb's nft tables left after the switch to eBPF:\n%s", got)
	}
	e.mustCLI("farm", "del", "web")
	if reply, err := testutil.AskTCP(e.topo.Client.NS, vip); err == nil {
		t.Fatalf("the farm deleted after the switch to eBPF still answers: %q", reply)
	}
}

// xlb daemon --cleanup removes everything xlb put in the kernel, of
// either plane, and nothing of anyone else's: no nft table of xlb's (the
// farms' and the named tables'), no pin, no tcx link; another program's
// table, and the kube-proxy's, stay.
func TestCleanup(t *testing.T) {
	e, pin := newEBPFEnv(t)
	vip := netip.AddrPortFrom(testutil.VIP4(26), 80)
	e.addWebFarm(vip.Addr())
	e.requireAllBackends(vip, 9)
	e.kill()
	// nft's objects too: a daemon on nft leaves its tables.
	e.args = []string{"--pin-path", t.TempDir()} // not the eBPF pins: keep them for --cleanup
	e.start()
	e.mustCLI("table", "create", "bad", "type", "addr", "verdict", "deny")
	e.kill()
	e.nft("add", "table", "inet", "firewalld")
	e.nft("add", "table", "inet", "xlb-kube")
	if got := e.xlbTCX(); len(got) == 0 || pins(t, pin) == "" || !strings.Contains(e.nftList(), "table inet xlb-tables") {
		t.Fatalf("nothing to clean up: tcx %v, pins %q, ruleset:\n%s", got, pins(t, pin), e.nftList())
	}
	out, err := exec.Command("ip", "netns", "exec", e.topo.LB.Name, e.bin, "daemon", "--cleanup", "--pin-path", pin).CombinedOutput()
	if err != nil {
		t.Fatalf("xlb daemon --cleanup: %v: %s", err, out)
	}
	t.Logf("xlb daemon --cleanup:\n%s", out)
	ruleset := e.nftList()
	for _, name := range []string{"xlb-00", "xlb-1f", "xlb-tables", "netdev xlb"} {
		if strings.Contains(ruleset, name) {
			t.Errorf("%s left by --cleanup:\n%s", name, ruleset)
		}
	}
	for _, keep := range []string{"table inet firewalld", "table inet xlb-kube"} {
		if !strings.Contains(ruleset, keep) {
			t.Errorf("--cleanup removed %s, which is not the daemon's:\n%s", keep, ruleset)
		}
	}
	if got := pins(t, pin); got != "" {
		t.Errorf("pins left by --cleanup: %s", got)
	}
	if got := e.xlbTCX(); len(got) != 0 {
		t.Errorf("xlb programs still attached after --cleanup: %v", got)
	}
	if _, err := testutil.AskTCP(e.topo.Client.NS, vip); err == nil {
		t.Errorf("the VIP still answers after --cleanup")
	}
	// Run again: nothing left.
	out, err = exec.Command("ip", "netns", "exec", e.topo.LB.Name, e.bin, "daemon", "--cleanup", "--pin-path", pin).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "nothing of xlb's") {
		t.Errorf("a second --cleanup: %v: %s", err, out)
	}
}
