package lvs

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

func convertFile(t *testing.T, path string) *Result {
	t.Helper()
	nodes, err := ParseKeepalivedFile(path)
	if err != nil {
		t.Fatal(err)
	}
	res, err := ConvertKeepalived(nodes)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func farmNamed(t *testing.T, res *Result, name string) *model.Farm {
	t.Helper()
	for i := range res.Farms {
		if res.Farms[i].Name == name {
			return &res.Farms[i]
		}
	}
	var names []string
	for _, f := range res.Farms {
		names = append(names, f.Name)
	}
	t.Fatalf("no farm %q in %v", name, names)
	return nil
}

// TestConvertFull: every virtual server of testdata/full.conf (which
// keepalived itself takes: TestKeepalivedTakesTestdata) as the farm it
// means.
func TestConvertFull(t *testing.T) {
	res := convertFile(t, "testdata/full.conf")
	if len(res.Farms) != 5 {
		t.Fatalf("%d farms, want 5", len(res.Farms))
	}

	web := farmNamed(t, res, "vs_192.0.2.10_80")
	if web.Mode != model.ModeDNAT || web.Scheduler != model.SchedWeight || web.Protocol != model.ProtoTCP ||
		web.Persistence != model.KeySrcIP || web.PersistTTL != 300 || len(web.Backends) != 4 {
		t.Errorf("web: mode %s sched %s proto %s persistence %v/%d backends %d", web.Mode, web.Scheduler, web.Protocol, web.Persistence, web.PersistTTL, len(web.Backends))
	}
	c := web.Check
	if c == nil || c.Type != model.CheckHTTP || c.Path != "/health" || !slices.Equal(c.Status, []model.StatusRange{{First: 200, Last: 299}, {First: 301, Last: 301}}) ||
		c.Inter != 6*time.Second || c.Timeout != 3*time.Second || c.FastInter != 2*time.Second || c.Rise != 1 || c.Fall != 4 ||
		!c.Inhibit || c.Quorum != 2 || c.Hysteresis != 1 || c.SorryServer != "sorry-server" || c.InitState != model.InitUp {
		t.Errorf("web's check: %+v", c)
	}
	if b := web.Backends[0]; b.Name != "10.0.0.11_8080" || b.Port != 8080 || b.Weight != 1 || b.Check != nil {
		t.Errorf("web's first backend (the farm's check): %+v", b)
	}
	if b := web.Backends[2]; b.Check == nil || b.Check.Type != model.CheckTCP || b.Check.Port != 9000 ||
		b.Check.Timeout != 1500*time.Millisecond || b.Check.Fall != 2 || b.Check.FastInter != time.Second || b.Check.Inter != 6*time.Second {
		t.Errorf("web's third backend (its own TCP_CHECK): %+v", b.Check)
	}
	if b := web.Backends[3]; b.Name != "sorry-server" || b.Addr != netip.MustParseAddr("10.0.0.99") || b.Port != 8080 {
		t.Errorf("web's sorry server: %+v", b)
	}

	tls := farmNamed(t, res, "vs_192.0.2.20_443")
	if tls.Mode != model.ModeDSR || tls.Scheduler != model.SchedWLC || tls.Backends[0].Port != 0 || tls.Backends[0].Weight != 3 {
		t.Errorf("tls: mode %s sched %s first backend %+v", tls.Mode, tls.Scheduler, tls.Backends[0])
	}
	c = tls.Check
	if c == nil || c.Type != model.CheckHTTPS || c.BodyDigest != "9b3a0c85a887a256d6939da88aabd8cd" || c.Host != "www.example.org" ||
		c.Inter != 60*time.Second || c.Timeout != 5*time.Second || c.Fall != 2 || c.FastInter != 3*time.Second ||
		c.InitState != model.InitDown || !slices.Equal(c.Status, []model.StatusRange{{First: 200, Last: 299}}) {
		t.Errorf("tls's check (keepalived's defaults, alpha): %+v", c)
	}
	if mc := tls.Backends[1].Check; mc == nil || mc.Type != model.CheckExec || mc.Timeout != 4*time.Second || mc.Fall != 1 || mc.FastInter != 0 ||
		!strings.Contains(mc.Command, "(/usr/local/bin/check-tls 10.0.0.22) ||") {
		t.Errorf("tls's MISC_CHECK: %+v", mc)
	}

	dns := farmNamed(t, res, "vs_192.0.2.30_53_udp")
	if dns.Protocol != model.ProtoUDP || dns.Scheduler != model.SchedHash || dns.SchedParam != model.KeySrcIP {
		t.Errorf("dns: proto %s sched %s %v", dns.Protocol, dns.Scheduler, dns.SchedParam)
	}
	if c := dns.Check; c == nil || c.Type != model.CheckUDP || c.Send != "hex:01020a" || c.Expect != "hex:00" {
		t.Errorf("dns's UDP_CHECK: %+v", c)
	}
	if c := dns.Backends[1].Check; c == nil || c.Type != model.CheckNone {
		t.Errorf("dns's unchecked real server: check %+v, want none", c)
	}

	v6 := farmNamed(t, res, "vs_2001-db8--10_80")
	if v6.Family != model.FamilyIPv6 || v6.Scheduler != model.SchedMaglev || v6.Check != nil {
		t.Errorf("v6: family %s sched %s check %+v", v6.Family, v6.Scheduler, v6.Check)
	}
	fwm := farmNamed(t, res, "fwm_7")
	if fwm.Mark != 7 || fwm.VirtualAddr.IsValid() || fwm.Protocol != model.ProtoAll || fwm.Scheduler != model.SchedRR {
		t.Errorf("fwm: mark %d addr %s proto %s sched %s", fwm.Mark, fwm.VirtualAddr, fwm.Protocol, fwm.Scheduler)
	}

	notes := strings.Join(res.Notes, "\n")
	for _, want := range []string{"vrrp.conf:1: vrrp_instance: VRRP is not imported", "full.conf:46: notify_down: no effect"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
}

// TestKeepalivedTakesTestdata: Debian's keepalived (2.2.7) takes the
// configurations the tests import, without a warning.
func TestKeepalivedTakesTestdata(t *testing.T) {
	bin := testutil.KeepalivedBinary(t)
	for _, f := range []string{"testdata/full.conf", "testdata/vrrp.conf"} {
		if out, err := exec.Command(bin, "-t", "-f", f).CombinedOutput(); err != nil || len(out) != 0 {
			t.Errorf("keepalived -t -f %s: %v: %s", f, err, out)
		}
	}
}

// TestDefaultsAsKeepalived: a virtual server that names no protocol,
// scheduler or forwarding method gets what keepalived says it gives it.
func TestDefaultsAsKeepalived(t *testing.T) {
	bin := testutil.KeepalivedBinary(t)
	conf := filepath.Join(t.TempDir(), "defaults.conf")
	if err := os.WriteFile(conf, []byte("virtual_server 192.0.2.1 53 {\n real_server 10.0.0.1 53 {\n }\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command(bin, "-t", "-f", conf).CombinedOutput()
	for _, want := range []string{"no protocol set - defaulting to UDP", "no scheduler set, setting default 'wlc'", "no forwarding method set, setting default NAT"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("keepalived -t no longer says %q (its defaults changed?):\n%s", want, out)
		}
	}
	f := convertFile(t, conf).Farms[0]
	if f.Protocol != model.ProtoUDP || f.Scheduler != model.SchedWLC || f.Mode != model.ModeDNAT {
		t.Errorf("defaults: protocol %s, scheduler %s, mode %s; want udp, wlc, dnat (keepalived's)", f.Protocol, f.Scheduler, f.Mode)
	}
}

// TestRefused: what xlb cannot do as keepalived and IPVS would is refused,
// naming the file, the line and the keyword.
func TestRefused(t *testing.T) {
	for _, c := range []struct{ conf, want string }{
		{"virtual_server 192.0.2.1 80 {\n lb_kind TUN\n}\n", "x.conf:2: lb_kind TUN: xlb does not tunnel"},
		{"virtual_server 192.0.2.1 80 {\n lb_algo sed\n}\n", "x.conf:2: lb_algo sed: xlb has no such scheduler"},
		{"virtual_server group g1 {\n}\n", "x.conf:1: virtual_server group g1: groups are not imported"},
		{"virtual_server 192.0.2.1 80 {\n real_server 10.0.0.1 80 {\n  DNS_CHECK {\n  }\n }\n}\n", "x.conf:3: DNS_CHECK is not imported"},
		{"virtual_server 192.0.2.1 80 {\n real_server 10.0.0.1 80 {\n  TCP_CHECK {\n  }\n  HTTP_GET {\n   url {\n    path /\n   }\n  }\n }\n}\n", "x.conf:5: a second checker"},
		{"virtual_server 192.0.2.1 80 {\n real_server 10.0.0.1 80 {\n  HTTP_GET {\n   url {\n    path /a\n   }\n   url {\n    path /b\n   }\n  }\n }\n}\n", "x.conf:7: HTTP_GET with 2 url blocks"},
		{"virtual_server 192.0.2.1 80 {\n persistence_granularity 255.255.255.0\n}\n", "x.conf:2: persistence_granularity 255.255.255.0"},
		{"virtual_server 192.0.2.1 80 {\n quorum 2\n real_server 10.0.0.1 80 {\n  weight 2\n  TCP_CHECK {\n  }\n }\n real_server 10.0.0.2 80 {\n  TCP_CHECK {\n  }\n }\n}\n", "x.conf:1: quorum and hysteresis count weight"},
		{"virtual_server 192.0.2.1 80 {\n real_server 10.0.0.1 80 {\n  inhibit_on_failure\n  TCP_CHECK {\n  }\n }\n real_server 10.0.0.2 80 {\n  TCP_CHECK {\n  }\n }\n}\n", "x.conf:1: inhibit_on_failure is set for some real servers only"},
		{"virtual_server 192.0.2.1 80 {\n real_server 10.0.0.1 80 {\n  TCP_CHECK {\n   connect_ip 10.0.0.9\n  }\n }\n}\n", "x.conf:4: connect_ip 10.0.0.9"},
		{"virtual_server 192.0.2.1 80 {\n delay_loop soon\n}\n", "x.conf:2: delay_loop \"soon\": want seconds"},
		{"virtual_server 192.0.2.1 80 {\n protocol UDP\n ops\n persistence_timeout 60\n}\n", "x.conf:3: ops is imported as a stateless farm"},
		{"virtual_server 192.0.2.1 80 {\n real_server 10.0.0.1 80 {\n }\n", "x.conf: a block is not closed"},
		{"@lvs1 virtual_server 192.0.2.1 80 {\n}\n", "x.conf:1: \"@lvs1\": keepalived's conditional configuration"},
		{"virtual_server 192.0.2.1 80 {\n}\nvirtual_server 192.0.2.1 80 {\n}\n", "x.conf:3: virtual_server 192.0.2.1 80 is declared twice (first at x.conf:1)"},
	} {
		nodes, err := ParseKeepalived(strings.NewReader(c.conf), "x.conf")
		if err == nil {
			_, err = ConvertKeepalived(nodes)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one containing %q", c.conf, err, c.want)
		}
	}
}

// TestMiscDynamic: a MISC_CHECK with misc_dynamic runs its script so that
// xlb's exec check reads what keepalived reads from the exit status:
// 0 up, 1 down, 2-255 up with weight status-2.
func TestMiscDynamic(t *testing.T) {
	for _, c := range []struct {
		status int
		out    string
		up     bool
	}{{0, "", true}, {1, "", false}, {2, "weight 0", true}, {12, "weight 10", true}, {255, "weight 253", true}} {
		conf := "virtual_server 192.0.2.1 80 {\n protocol TCP\n real_server 10.0.0.1 80 {\n  MISC_CHECK {\n   misc_path \"exit " +
			strconv.Itoa(c.status) + "\"\n   misc_dynamic\n  }\n }\n}\n"
		nodes, err := ParseKeepalived(strings.NewReader(conf), "x.conf")
		if err != nil {
			t.Fatal(err)
		}
		res, err := ConvertKeepalived(nodes)
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("/bin/sh", "-c", res.Farms[0].Check.Command).Output()
		if got := strings.TrimSpace(string(out)); got != c.out || (err == nil) != c.up {
			t.Errorf("exit %d: stdout %q, error %v; want %q, up %v", c.status, got, err, c.out, c.up)
		}
	}
}

// TestOpsKeepsPorts: a UDP service with one-packet scheduling becomes a
// stateless farm whose backends keep their ports (only DR drops them),
// on a virtual server of every port too.
func TestOpsKeepsPorts(t *testing.T) {
	for _, vs := range []string{"192.0.2.1 53", "192.0.2.1"} {
		conf := "virtual_server " + vs + " {\n protocol UDP\n ops\n real_server 10.0.0.1 5353 {\n }\n}\n"
		nodes, err := ParseKeepalived(strings.NewReader(conf), "x.conf")
		if err != nil {
			t.Fatal(err)
		}
		res, err := ConvertKeepalived(nodes)
		if err != nil {
			t.Fatalf("%s: %v", vs, err)
		}
		if f := res.Farms[0]; f.Mode != model.ModeStlsDNAT || f.Backends[0].Port != 5353 {
			t.Errorf("virtual_server %s with ops: mode %s, backend port %d; want stlsdnat, 5353", vs, f.Mode, f.Backends[0].Port)
		}
	}
}
