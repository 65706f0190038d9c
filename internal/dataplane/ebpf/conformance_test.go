package ebpf

import (
	"context"
	"log/slog"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/conformance"
)

// ebpfRefuses is what the eBPF plane refuses; keep it in step with Check
// and docs/dataplane-ebpf.md. Conntrack helpers are refused for good: they
// are netfilter conntrack, which this plane bypasses.
var ebpfRefuses = map[string]string{
	"protocol-all":                `"protocol" value "all"`,
	"protocol-sctp":               `"protocol" value "sctp"`,
	"sched-hash-srcmac":           `"sched-param" value "srcmac"`,
	"persistence-srcmac":          `"persistence" value "srcmac"`,
	"persistence-srcip-dstport":   `"persistence" value "srcip dstport"`,
	"limit-est-connlimit":         `"est-connlimit"`,
	"limit-backend-est-connlimit": `"est-connlimit"`,
	"tcp-strict":                  `"tcp-strict"`,
	"fwmark-farm":                 `before netfilter has marked it`,
	"helper-ftp":                  `"helper" value "ftp"`,
	"helper-tftp":                 `"helper" value "tftp"`,
	"helper-sip":                  `"helper" value "sip"`,
	"helper-amanda":               `"helper" value "amanda"`,
	"helper-h323":                 `"helper" value "h323"`,
	"helper-irc":                  `"helper" value "irc"`,
	"helper-netbios-ns":           `"helper" value "netbios-ns"`,
	"helper-pptp":                 `"helper" value "pptp"`,
	"helper-sane":                 `"helper" value "sane"`,
	"helper-snmp":                 `"helper" value "snmp"`,
	"source-table-queue":          `"queue" value "7"`,
	"mode-stlsdnat-ingress":       `"iface" value "eth0": mode stlsdnat at ingress`,
	"mode-stlsdnat-ingress-tcp":   `"iface" value "eth0": mode stlsdnat at ingress`,
	"mode-stlsdnat-ingress-ipv6":  `"iface" value "eth0": mode stlsdnat at ingress`,
}

// TestConformance runs the data-plane conformance suite against eBPF, the
// same scenarios the nft plane passes.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Plane{
		Name: "ebpf",
		Open: func(t testing.TB, path string) dataplane.Dataplane {
			ns, err := netns.GetFromPath(path)
			if err != nil {
				t.Fatalf("open namespace %s: %v", path, err)
			}
			t.Cleanup(func() { ns.Close() })
			sink := newConnLogSink(testLogger(t).Handler())
			registerConnLog(t, path, sink)
			p, err := New(context.Background(), slog.New(sink), Options{NetNS: ns, PinPath: mountBPFFS(t), ConnTableSize: 16384})
			if err != nil {
				t.Fatalf("new ebpf plane: %v", err)
			}
			t.Cleanup(func() { p.Close() })
			return p
		},
		ConnLog: connLogOf,
		Refuses: ebpfRefuses,
	})
}
