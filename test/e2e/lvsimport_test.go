package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestKeepalivedImport: an LVS director's keepalived.conf (a VRRP
// instance and a virtual server of three real servers with TCP_CHECKs),
// which Debian's keepalived itself takes (`keepalived -t`), is imported
// with `xlb import keepalived`, restored into the daemon and serves: every
// real server answers through the VIP; a real server that refuses
// connections is found down by the imported check and takes no new
// connection, and comes back when it answers again. The VRRP instance is
// named as not imported.
func TestKeepalivedImport(t *testing.T) {
	e := newEnv(t)
	vip := testutil.VIP4(1)
	var conf strings.Builder
	fmt.Fprintf(&conf, `global_defs {
    router_id lvs1
}
vrrp_instance VI_1 {
    state MASTER
    interface eth0
    virtual_router_id 51
    priority 100
    virtual_ipaddress {
        %s/32
    }
}
virtual_server %s 80 {
    delay_loop 0.2
    lb_algo wrr
    lb_kind NAT
    protocol TCP
`, vip, vip)
	for _, b := range e.topo.Backends {
		fmt.Fprintf(&conf, `    real_server %s 8080 {
        weight 1
        TCP_CHECK {
            connect_timeout 0.2
            retry 1
            delay_before_retry 0.1
        }
    }
`, b.IPv4)
	}
	conf.WriteString("}\n")
	dir := t.TempDir()
	file := filepath.Join(dir, "keepalived.conf")
	if err := os.WriteFile(file, []byte(conf.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(testutil.KeepalivedBinary(t), "-t", "-f", file).CombinedOutput(); err != nil {
		t.Fatalf("keepalived -t refuses the configuration: %v: %s", err, out)
	}
	state := filepath.Join(dir, "state.json")
	out := e.mustCLI("import", "keepalived", file, "-f", state)
	if !strings.Contains(out, "vrrp_instance: VRRP is not imported") {
		t.Errorf("xlb import did not name the VRRP instance as not imported:\n%s", out)
	}
	e.mustCLI("restore", "-f", state)
	farm := "vs_" + vip.String() + "_80"
	addr := netip.AddrPortFrom(vip, 80)
	be2 := fmt.Sprintf("%s:8080 ", e.topo.Backends[1].IPv4)
	waitBE2 := func(want string) {
		t.Helper()
		var out string
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			out = e.mustCLI("list", "-n")
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, be2) && strings.Contains(line, want) {
					return
				}
			}
		}
		t.Fatalf("be2's line of xlb list -n never showed %q:\n%s", want, out)
	}
	waitBE2("health up")
	e.requireAllBackends(addr, 9)
	refuseSYNs(t, e.topo.Backends[1].Name, 8080, true)
	waitBE2("health down")
	got, err := e.answers(addr, 30)
	if err != nil || got["backend-2"] != 0 || got["backend-1"] == 0 || got["backend-3"] == 0 {
		t.Errorf("farm %s after be2 was found down: answers %v, %v; want backends 1 and 3 only, none failed", farm, got, err)
	}
	refuseSYNs(t, e.topo.Backends[1].Name, 8080, false)
	waitBE2("health up")
	e.requireAllBackends(addr, 9)
}

// TestIPVSAdmImport: a director's rules as ipvsadm-save -n writes them,
// imported with `xlb import ipvsadm -` from stdin and restored into the
// daemon: every real server answers through the VIP.
func TestIPVSAdmImport(t *testing.T) {
	e := newEnv(t)
	vip := testutil.VIP4(1)
	rules := fmt.Sprintf("-A -t %s:80 -s rr\n", vip)
	for _, b := range e.topo.Backends {
		rules += fmt.Sprintf("-a -t %s:80 -r %s:8080 -m -w 1\n", vip, b.IPv4)
	}
	state := filepath.Join(t.TempDir(), "state.json")
	cmd := exec.Command("ip", "netns", "exec", e.topo.LB.Name, e.bin, "import", "ipvsadm", "-", "-f", state)
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("xlb import ipvsadm: %v: %s", err, out)
	}
	e.mustCLI("restore", "-f", state)
	if out := e.mustCLI("list", "-n"); !strings.Contains(out, "vs_"+vip.String()+"_80") && !strings.Contains(out, vip.String()+":80") {
		t.Errorf("xlb list -n after the restore:\n%s", out)
	}
	e.requireAllBackends(netip.AddrPortFrom(vip, 80), 9)
}
