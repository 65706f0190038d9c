package nft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// refMapElems is mapElems as it was before its keys and data shared one
// buffer (one allocation each): the elements must stay byte for byte the
// same (the hash scheduler's elements are those of plan.HashTable, one per
// slot, since it is the eBPF plane's table).
func refMapElems(p *farmPlan, f *model.Farm) ([]nftables.SetElement, uint32) {
	slot := func(b model.Backend) []byte {
		switch {
		case p.dsrMode:
			m := p.dsr.macs[b.Addr]
			return m[:]
		case p.ids:
			return binaryutil.NativeEndian.PutUint32(backendID(b))
		}
		d := append([]byte(nil), b.Addr.AsSlice()...)
		if p.kind == kindAddrPort {
			port := b.Port
			if port == 0 {
				port = p.port
			}
			d = pad4(binary.BigEndian.AppendUint16(d, port))
		}
		return d
	}
	var out []nftables.SetElement
	if f.Scheduler == model.SchedMaglev || f.Scheduler == model.SchedHash {
		table := plan.MaglevTable(f, p.active)
		if f.Scheduler == model.SchedHash {
			table = plan.HashTable(p.active)
		}
		for i, bi := range table {
			out = append(out, nftables.SetElement{Key: binaryutil.NativeEndian.PutUint32(uint32(i)), Val: slot(p.active[bi])})
		}
		return out, uint32(len(table))
	}
	if f.Scheduler != model.SchedWeight {
		for i, b := range p.active {
			out = append(out, nftables.SetElement{Key: binaryutil.NativeEndian.PutUint32(uint32(i)), Val: slot(b)})
		}
		return out, uint32(len(p.active))
	}
	var weights []uint32
	for _, b := range p.active {
		weights = append(weights, b.Weight)
	}
	var total uint32
	for i, n := range plan.SlotRuns(weights, plan.MaxWeightedSlots) {
		out = append(out,
			nftables.SetElement{Key: binaryutil.BigEndian.PutUint32(total), Val: slot(p.active[i])},
			nftables.SetElement{Key: binaryutil.BigEndian.PutUint32(total + uint32(n)), IntervalEnd: true})
		total += uint32(n)
	}
	return out, total
}

func TestMapElemsBytes(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		for _, sched := range []model.Scheduler{model.SchedRR, model.SchedWeight, model.SchedHash, model.SchedMaglev} {
			for _, variant := range []string{"addr", "port", "someports", "persist", "dsr"} {
				f := model.NewFarm("f")
				f.VirtualAddr = netip.MustParseAddr("10.0.0.1")
				if v6 {
					f.Family = model.FamilyIPv6
					f.VirtualAddr = netip.MustParseAddr("fd00::1")
				}
				f.VirtualPorts = []model.PortRange{{First: 80, Last: 80}}
				f.Scheduler = sched
				if sched == model.SchedHash {
					f.SchedParam = model.KeySrcIP
				}
				link := &dsrLink{macs: map[netip.Addr][etherAlen]byte{}}
				for j := range 37 {
					b := model.NewBackend(fmt.Sprintf("b%d", j))
					b.Addr = netip.AddrFrom4([4]byte{172, 16, 0, byte(j + 1)})
					if v6 {
						b.Addr = netip.AddrFrom16([16]byte{0xfd, 1, 15: byte(j + 1)})
					}
					b.Weight = uint32(j%5 + 1)
					switch variant {
					case "port", "persist":
						b.Port = 8080
					case "someports":
						if j%2 == 0 {
							b.Port = uint16(8000 + j)
						}
					}
					link.macs[b.Addr] = [etherAlen]byte{2, 0, 0, 0, 0, byte(j)}
					f.Backends = append(f.Backends, b)
				}
				if variant == "persist" {
					f.Persistence, f.PersistTTL = model.KeySrcIP, 60
				}
				p := planFarm(&f)
				if variant == "dsr" {
					p.dsrMode, p.dsr = true, link
				}
				got, gm := p.mapElems(&f)
				want, wm := refMapElems(p, &f)
				if gm != wm || !reflect.DeepEqual(got, want) {
					t.Errorf("v6 %v scheduler %s %s: elements differ (modulus %d, want %d)", v6, sched, variant, gm, wm)
				}
			}
		}
	}
}

// BenchmarkPlanFarm100Backends is the pure part of building a farm of
// 100 backends for the kernel (no netlink): its plan, its backend map's
// elements and its rules.
func BenchmarkPlanFarm100Backends(b *testing.B) {
	f := benchFarm(1, 100)
	b.ReportAllocs()
	for b.Loop() {
		p := planFarm(f)
		_, m := p.mapElems(f)
		p.farmRules(f, "map", 1, m, nil, nil)
	}
}
