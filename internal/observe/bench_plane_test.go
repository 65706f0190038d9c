package observe

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/ebpf"
	"github.com/xlb-lb/xlb/internal/dataplane/nft"
	"github.com/xlb-lb/xlb/internal/engine"
	xmodel "github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// BenchmarkScrapePlane is one scrape with 1,000 farms of 10 backends held
// by a real data plane in a namespace, as in the daemon: the counters from
// the rate estimator's last read (scrape), or read by the scrape itself
// (eBPF: a batched read of its counter slots; nft: a dump of its counter sets), and
// the connection table walked (eBPF: batched walk of its own table; nft:
// a netlink dump of netfilter's conntrack). Target: under 100 ms.
func BenchmarkScrapePlane(b *testing.B) {
	for _, plane := range []string{"ebpf", "nft"} {
		b.Run(plane, func(b *testing.B) {
			eng := benchEngine(b, plane, 1000, 10)
			ctx := context.Background()
			rates := NewRates(eng, discard())
			// The daemon's scrape: counters from the rate estimator's
			// last read (every 2 s), as the daemon wires it.
			b.Run("scrape", func(b *testing.B) {
				m := New(Options{Engine: eng, Version: "bench", Dataplane: plane, ConnWalkEvery: 1, Rates: rates})
				rates.Sample(ctx)
				var size int
				for b.Loop() {
					body, err := m.Expose(ctx)
					if err != nil {
						b.Fatal(err)
					}
					size = len(body)
				}
				b.ReportMetric(float64(size), "bytes/scrape")
			})
			// Without the estimator (the Kubernetes proxy): the scrape
			// reads the counters itself.
			b.Run("scrape-reading-counters", func(b *testing.B) {
				m := New(Options{Engine: eng, Version: "bench", Dataplane: plane, ConnWalkEvery: 1})
				for b.Loop() {
					if _, err := m.Expose(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
			// What the estimator pays every 2 s.
			b.Run("rate-sample", func(b *testing.B) {
				for b.Loop() {
					rates.Sample(ctx)
				}
			})
		})
	}
}

func putFarms(tb testing.TB, eng *engine.Engine, farms, backends int) {
	tb.Helper()
	_, err := eng.Change(context.Background(), func(tx *engine.Txn) error {
		for i := range farms {
			f := xmodel.NewFarm(fmt.Sprintf("farm%d", i))
			f.Mode = xmodel.ModeDNAT
			f.VirtualAddr = netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)})
			f.VirtualPorts = []xmodel.PortRange{{First: 80, Last: 80}}
			for j := range backends {
				bk := xmodel.NewBackend(fmt.Sprintf("b%d", j))
				bk.Addr = netip.AddrFrom4([4]byte{10, 200 + byte(j>>8), byte(j), byte(i)})
				bk.Port = 8080
				f.Backends = append(f.Backends, bk)
			}
			if err := tx.Put(f); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
}

func benchBPFFS(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "xlb-bpffs-")
	if err != nil {
		tb.Fatal(err)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		os.Remove(dir)
		tb.Fatalf("mount bpffs at %s: %v", dir, err)
	}
	tb.Cleanup(func() {
		unix.Unmount(dir, unix.MNT_DETACH)
		os.Remove(dir)
	})
	return dir + "/xlb"
}

// BenchmarkRateTick is one tick of the rate estimator (a read of every
// counter and the estimates' update) with 10 farms of 1,000 backends held
// by a real data plane in a namespace: what bench/health's idle daemon
// pays every 2 s (bench/results/health-cpu.md).
func BenchmarkRateTick(b *testing.B) {
	for _, plane := range []string{"ebpf", "nft"} {
		b.Run(plane, func(b *testing.B) {
			eng := benchEngine(b, plane, 10, 1000)
			rates := NewRates(eng, discard())
			ctx := context.Background()
			rates.Sample(ctx)
			b.ReportAllocs()
			for b.Loop() {
				rates.Sample(ctx)
			}
		})
	}
}

// benchEngine is an engine over a real plane in a new namespace holding
// farms of backends each.
func benchEngine(b *testing.B, plane string, farms, backends int) *engine.Engine {
	testutil.RequireRoot(b)
	_, ns := testutil.NewNetNS(b)
	ctx := context.Background()
	var dp dataplane.Dataplane
	var err error
	if plane == "ebpf" {
		dp, err = ebpf.New(ctx, discard(), ebpf.Options{NetNS: ns, PinPath: benchBPFFS(b), ConnTableSize: 262144})
	} else {
		dp, err = nft.New(ctx, discard(), nft.Options{NetNS: ns})
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dp.Close() })
	st, err := store.OpenBolt(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	eng, err := engine.New(ctx, discard(), dp, st)
	if err != nil {
		b.Fatal(err)
	}
	putFarms(b, eng, farms, backends)
	return eng
}
