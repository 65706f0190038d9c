package ebpf

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/conformance"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestConnections lists, counts and deletes connections of the plane's own
// conntrack table with real traffic (batched map walks).
func TestConnections(t *testing.T) {
	conformance.RunConnections(t, connPlane(), connTable)
}

// TestSourceTableConnections: two farms on one key, one chosen by source
// table, with the same backends: each lists, counts and deletes its own
// clients' connections only (plan.ConnOwners).
func TestSourceTableConnections(t *testing.T) {
	conformance.RunSourceTableConnections(t, connPlane(), connTable)
}

func connPlane() conformance.Plane {
	return conformance.Plane{
		Name: "ebpf",
		Open: func(t testing.TB, path string) dataplane.Dataplane {
			ns, err := netns.GetFromPath(path)
			if err != nil {
				t.Fatalf("open namespace %s: %v", path, err)
			}
			t.Cleanup(func() { ns.Close() })
			p, err := New(context.Background(), testLogger(t), Options{NetNS: ns, PinPath: mountBPFFS(t), ConnTableSize: 16384})
			if err != nil {
				t.Fatalf("new ebpf plane: %v", err)
			}
			t.Cleanup(func() { p.Close() })
			return p
		},
	}
}

func connTable(t testing.TB, dp dataplane.Dataplane, _ string) dataplane.ConnLister {
	return dp.(*Plane)
}

// BenchmarkCountConns is one walk of the conntrack table (batched
// lookups) counting a farm's connections per backend, what a scrape of
// /metrics does, with the table holding n connections (2n entries). The
// entries are closing ones (FIN: inactive), which the walk attributes; the
// active count is the program's own (xlb_be_active), which entries written
// from here do not change.
func BenchmarkCountConns(b *testing.B) {
	for _, n := range []int{0, 100_000, 500_000} {
		b.Run(fmt.Sprintf("conns=%d", n), func(b *testing.B) {
			testutil.RequireRoot(b)
			_, ns := testutil.NewNetNS(b)
			p, err := New(context.Background(), slog.New(slog.DiscardHandler), Options{NetNS: ns, PinPath: mountBPFFS(b), ConnTableSize: 4 * max(n, 1024)}) // room: an LRU evicts before it is full
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { p.Close() })
			f := farm(b, "web", vip1.String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, "10.200.0.11:8080", "10.200.0.12:8080", "10.200.0.13:8080")
			if err := p.Apply(context.Background(), plan.Diff{Changes: []plan.FarmChange{{New: f}}}); err != nil {
				b.Fatal(err)
			}
			keys := make([]xlbCtKey, 0, 2*n)
			vals := make([]xlbCtVal, 0, 2*n)
			for i := range n {
				client := [4]uint32{ne32(netip.AddrFrom4([4]byte{11, byte(i >> 16), byte(i >> 8), byte(i)}))}
				be := [4]uint32{ne32(netip.AddrFrom4([4]byte{10, 200, 0, byte(11 + i%3)}))}
				fk := xlbCtKey{Src: client, Dst: [4]uint32{ne32(vip1)}, Sport: ne16(40000), Dport: ne16(80), Proto: protoTCP, Family: afInet}
				fv := xlbCtVal{Src: client, Dst: be, Sport: ne16(40000), Dport: ne16(8080), Dir: ctFwd, State: ctStateFIN, Seen: monotonicCoarse()}
				rk := xlbCtKey{Src: be, Dst: client, Sport: ne16(8080), Dport: ne16(40000), Proto: protoTCP, Family: afInet}
				rv := fv
				rv.Dir = ctReply
				keys = append(keys, fk, rk)
				vals = append(vals, fv, rv)
			}
			if n > 0 {
				if _, err := p.objs.XlbCt.BatchUpdate(keys, vals, nil); err != nil {
					b.Fatal(err)
				}
			}
			farms := []*model.Farm{f}
			var t dataplane.ConnTable
			for b.Loop() {
				if t, err = p.CountConns(context.Background(), farms, nil); err != nil {
					b.Fatal(err)
				}
			}
			var inactive uint64
			for _, c := range t.Backends["web"] {
				inactive += c.Inactive
			}
			if inactive != uint64(n) || t.Entries != uint64(2*n) {
				b.Fatalf("counted %d inactive connections in %d entries, want %d in %d", inactive, t.Entries, n, 2*n)
			}
		})
	}
}
