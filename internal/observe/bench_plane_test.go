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
// by a real data plane in a namespace: the plane's counters (eBPF: a map
// lookup per backend) and its connection table (eBPF: batched walk of its
// own table; nft: a netlink dump of netfilter's conntrack) are read, as
// in the daemon. Target: under 100 ms.
func BenchmarkScrapePlane(b *testing.B) {
	for _, plane := range []string{"ebpf", "nft"} {
		b.Run(plane, func(b *testing.B) {
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
			putFarms(b, eng, 1000, 10)
			m := New(Options{Engine: eng, Version: "bench", Dataplane: plane, ConnWalkEvery: 1})
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
				bk.Addr = netip.AddrFrom4([4]byte{10, 200, byte(j), byte(i)})
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
