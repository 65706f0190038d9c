package plan

import (
	"net/netip"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
)

func TestConnOwners(t *testing.T) {
	a := netip.MustParseAddr
	vip := netip.MustParseAddrPort("10.99.0.1:80")
	farm := func(name, table string, backends ...string) *model.Farm {
		f := model.NewFarm(name)
		f.VirtualAddr, f.Protocol = vip.Addr(), model.ProtoTCP
		f.VirtualPorts = []model.PortRange{{First: 80, Last: 80}}
		f.SourceTable = table
		for i, b := range backends {
			f.Backends = append(f.Backends, model.Backend{Name: string(rune('a' + i)), Addr: a(b), State: model.StateUp, Weight: 1})
		}
		return &f
	}
	table := func(name string, prio uint32, keys ...string) *model.Table {
		tb := model.NewTable(name, model.TableAddr)
		tb.Priority = prio
		for _, k := range keys {
			e, err := tb.ParseEntry(model.EntryInput{Key: k}, 0)
			if err != nil {
				t.Fatal(err)
			}
			tb.PutEntry(e)
		}
		return &tb
	}
	dflt := farm("dflt", "", "10.200.0.1", "10.200.0.2")
	near := farm("near", "near", "10.200.0.1", "10.200.0.2")
	own := farm("own", "wide", "10.200.0.9")
	other := farm("other", "", "10.200.0.1")
	other.VirtualAddr = a("10.99.0.2")
	tables := map[string]*model.Table{
		"near": table("near", 1, "10.100.0.0/24"),
		"wide": table("wide", 2, "10.100.0.0/16"),
	}
	o := NewConnOwners([]*model.Farm{dflt, near, own, other}, tables)
	for _, c := range []struct {
		vip             netip.AddrPort
		client, backend string
		want            string
	}{
		{vip, "10.100.0.5", "10.200.0.1", "near"},                                 // both tables hold it: the first in SourceOrder
		{vip, "10.100.7.5", "10.200.0.1", "dflt"},                                 // only "wide" holds it, but "own" has no such backend
		{vip, "10.100.7.5", "10.200.0.9", "own"},                                  // the backend tells
		{vip, "10.100.0.5", "10.200.0.9", "own"},                                  // the backend tells, whatever the tables
		{vip, "10.7.0.5", "10.200.0.2", "dflt"},                                   // no table holds it
		{netip.MustParseAddrPort("10.99.0.2:80"), "10.100.0.5", "10.200.0.1", ""}, // a key of one farm
		{netip.MustParseAddrPort("10.99.0.1:81"), "10.100.0.5", "10.200.0.1", ""}, // no farm's port
	} {
		if got := o.Owner(6, c.vip, a(c.client), a(c.backend)); got != c.want {
			t.Errorf("Owner(%s, client %s, backend %s) = %q, want %q", c.vip, c.client, c.backend, got, c.want)
		}
	}
	// No farm chosen by source table: nothing to tell apart.
	if got := NewConnOwners([]*model.Farm{dflt, other}, nil).Owner(6, vip, a("10.100.0.5"), a("10.200.0.1")); got != "" {
		t.Errorf("without source farms: Owner = %q, want \"\"", got)
	}
	var none *ConnOwners
	if got := none.Owner(6, vip, a("10.100.0.5"), a("10.200.0.1")); got != "" {
		t.Errorf("nil ConnOwners: Owner = %q, want \"\"", got)
	}
}
