package lvs

import (
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
)

// TestConvertIPVSAdm: ipvsadm-save -n's rules (services of each kind,
// ipvsadm's defaults) as the farms they mean.
func TestConvertIPVSAdm(t *testing.T) {
	rules := `# ipvsadm-save -n
-A -t 192.0.2.10:80 -s wrr -p
-a -t 192.0.2.10:80 -r 10.0.0.11:8080 -m -w 2
-a -t 192.0.2.10:80 -r 10.0.0.12:8080 -m -w 1 -x 100
-A -u [2001:db8::1]:53 -s sh -b sh-port
-a -u [2001:db8::1]:53 -r [2001:db8::11]:53 -g -w 1
-A -f 7
-a -f 7 -r 10.0.0.5:0
ipvsadm -A --sctp-service 192.0.2.20:3868 --scheduler mh --persistent 60
ipvsadm -a --sctp-service 192.0.2.20:3868 --real-server 10.0.0.21:3868 --masquerading --weight 3
`
	res, err := ConvertIPVSAdm(strings.NewReader(rules), "rules")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Farms) != 4 {
		t.Fatalf("%d farms, want 4", len(res.Farms))
	}
	web := farmNamed(t, res, "vs_192.0.2.10_80")
	if web.Mode != model.ModeDNAT || web.Scheduler != model.SchedWeight || web.Persistence != model.KeySrcIP || web.PersistTTL != 300 ||
		len(web.Backends) != 2 || web.Backends[0].Weight != 2 || web.Backends[0].Port != 8080 || web.Backends[1].EstConnLimit != 100 {
		t.Errorf("web: %+v", web)
	}
	dns := farmNamed(t, res, "vs_2001-db8--1_53_udp")
	if dns.Mode != model.ModeDSR || dns.Scheduler != model.SchedHash || dns.SchedParam != model.KeySrcIP|model.KeySrcPort ||
		dns.Family != model.FamilyIPv6 || dns.Backends[0].Port != 0 {
		t.Errorf("dns: mode %s sched %s %v family %s backend %+v", dns.Mode, dns.Scheduler, dns.SchedParam, dns.Family, dns.Backends[0])
	}
	fwm := farmNamed(t, res, "fwm_7")
	if fwm.Mark != 7 || fwm.Scheduler != model.SchedWLC || fwm.Mode != model.ModeDSR || fwm.Protocol != model.ProtoAll {
		t.Errorf("fwm (ipvsadm's defaults: wlc, gatewaying): mark %d sched %s mode %s proto %s", fwm.Mark, fwm.Scheduler, fwm.Mode, fwm.Protocol)
	}
	sctp := farmNamed(t, res, "vs_192.0.2.20_3868_sctp")
	if sctp.Protocol != model.ProtoSCTP || sctp.Scheduler != model.SchedMaglev || sctp.PersistTTL != 60 || sctp.Backends[0].Weight != 3 {
		t.Errorf("sctp: %+v", sctp)
	}
}

// TestIPVSAdmRefused: what xlb cannot do as IPVS would, and rules that are
// not ipvsadm-save's, are refused with the line.
func TestIPVSAdmRefused(t *testing.T) {
	for _, c := range []struct{ rules, want string }{
		{"-A -t 192.0.2.1:80 -s sed\n", "r:1: -s sed: xlb has no such scheduler"},
		{"-A -t 192.0.2.1:80\n-a -t 192.0.2.1:80 -r 10.0.0.1:80 -i\n", "r:2: forwarding method TUN"},
		{"-A -t 192.0.2.1:80\n-a -t 192.0.2.1:80 -r 10.0.0.1:80 -m\n-a -t 192.0.2.1:80 -r 10.0.0.2:80 -g\n", "r:3: real server forwarded with -g, its service's first with -m"},
		{"-a -t 192.0.2.1:80 -r 10.0.0.1:80 -m\n", "r:1: real server of service -t 192.0.2.1:80, which no -A line before adds"},
		{"-A -t 192.0.2.1:80 -p 60 -M 255.255.255.0\n", "r:1: -M 255.255.255.0"},
		{"-E -t 192.0.2.1:80 -s rr\n", "r:1: -E is not a rule ipvsadm-save writes"},
		{"-A -t 192.0.2.1\n", "r:1: -t \"192.0.2.1\": want ADDRESS:PORT"},
		{"-A -t 192.0.2.1:80 --pe sip\n", "r:1: --pe is not imported"},
		{"-A -t 192.0.2.1:80\n-A -t 192.0.2.1:80\n", "r:2: service -t 192.0.2.1:80 is added twice (first at r:1)"},
		{"-A -t 192.0.2.1:80 -o\n", "r:1: -o (one-packet scheduling) is imported as a stateless farm"},
	} {
		_, err := ConvertIPVSAdm(strings.NewReader(c.rules), "r")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one containing %q", c.rules, err, c.want)
		}
	}
}

// TestReplaceLeastConn: --lc-as gives lc and wlc farms (ipvsadm's default
// wlc) another scheduler for the nft plane, and only them; without it
// they are kept and noted.
func TestReplaceLeastConn(t *testing.T) {
	rules := "-A -t 192.0.2.1:80\n-A -t 192.0.2.2:80 -s lc\n-A -t 192.0.2.3:80 -s rr\n"
	res, err := ConvertIPVSAdm(strings.NewReader(rules), "r")
	if err != nil {
		t.Fatal(err)
	}
	if err := res.ReplaceLeastConn(""); err != nil || len(res.Notes) != 2 || res.Farms[0].Scheduler != model.SchedWLC {
		t.Errorf("without --lc-as: %v, notes %q, first farm %s", err, res.Notes, res.Farms[0].Scheduler)
	}
	if err := res.ReplaceLeastConn("wrr"); err != nil {
		t.Fatal(err)
	}
	for i, want := range []model.Scheduler{model.SchedWeight, model.SchedWeight, model.SchedRR} {
		if got := res.Farms[i].Scheduler; got != want {
			t.Errorf("farm %s: scheduler %s, want %s", res.Farms[i].Name, got, want)
		}
	}
	if err := res.ReplaceLeastConn("sed"); err != nil {
		t.Errorf("no lc farm left, yet --lc-as sed: %v", err)
	}
	res, _ = ConvertIPVSAdm(strings.NewReader(rules), "r")
	for _, bad := range []string{"sed", "lc"} {
		if err := res.ReplaceLeastConn(bad); err == nil {
			t.Errorf("--lc-as %s: no error", bad)
		}
	}
}

// TestMaglevFromMH: IPVS's mh (with mh-port too) becomes maglev, with a
// note that xlb's maglev hashes the whole flow where mh hashes the
// client; mh-port once failed validation (a hash key on maglev).
func TestMaglevFromMH(t *testing.T) {
	res, err := ConvertIPVSAdm(strings.NewReader("-A -t 192.0.2.40:80 -s mh -b mh-port\n-A -t 192.0.2.41:80 -s mh\n"), "r")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range res.Farms {
		if f.Scheduler != model.SchedMaglev || f.SchedParam != 0 {
			t.Errorf("%s: scheduler %s, keys %v; want maglev without keys", f.Name, f.Scheduler, f.SchedParam)
		}
	}
	if n := strings.Count(strings.Join(res.Notes, "\n"), "mh imported as maglev"); n != 2 {
		t.Errorf("%d notes of mh as maglev, want 2: %q", n, res.Notes)
	}
}
