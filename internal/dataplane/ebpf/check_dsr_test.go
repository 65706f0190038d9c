package ebpf

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
)

// nftlb's dsr overrides (iface, oface, ether-addr) are refused, not
// ignored: this plane finds next hops itself.
func TestCheckRefusesDSROverrides(t *testing.T) {
	base := func() model.Farm {
		f := model.NewFarm("d")
		f.VirtualAddr = netip.MustParseAddr("10.0.0.1")
		f.VirtualPorts = []model.PortRange{{First: 80, Last: 80}}
		f.Mode = model.ModeDSR
		b := model.NewBackend("b")
		b.Addr = netip.MustParseAddr("10.0.1.1")
		f.Backends = []model.Backend{b}
		return f
	}
	ok := base()
	if err := check(&ok); err != nil {
		t.Fatalf("plain dsr farm: %v", err)
	}
	for field, edit := range map[string]func(*model.Farm){
		"iface":      func(f *model.Farm) { f.Iface = "eth0" },
		"oface":      func(f *model.Farm) { f.Oface = "eth1" },
		"ether-addr": func(f *model.Farm) { f.Backends[0].EtherAddr = model.EtherAddr{2, 0, 0, 0, 0, 1} },
	} {
		f := base()
		edit(&f)
		var fe *model.FieldError
		if err := check(&f); !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: check = %v, want a FieldError on %q", field, err, field)
		}
	}
}
