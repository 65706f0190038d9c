package nft

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
)

func maglevBackends(n int) []model.Backend {
	var out []model.Backend
	for i := range n {
		b := model.NewBackend(fmt.Sprintf("b%d", i))
		b.Addr = netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		b.Port = 8080
		out = append(out, b)
	}
	return out
}

// owners maps each slot to its backend's address.
func owners(bs []model.Backend, configured int) []netip.Addr {
	t := maglevTable(bs, configured)
	out := make([]netip.Addr, len(t))
	for i, b := range t {
		out[i] = bs[b].Addr
	}
	return out
}

// TestMaglevTable: every backend owns about M/N slots; a backend of N
// going down changes about 1/N of the slots, nearly all of them its own;
// adding one (while the table size stays) moves about 1/(N+1). Maglev is
// not perfectly minimal: with M about 100 N a few percent of the slots
// also change between remaining backends (measured: 0.2% at N=3, 3% at
// N=10, 1.5% at N=50); the bound here is 4%.
func TestMaglevTable(t *testing.T) {
	for _, n := range []int{3, 10, 50} {
		bs := maglevBackends(n + 1)
		before := owners(bs[:n], n)
		m := len(before)
		if m != maglevSize(n) {
			t.Fatalf("n=%d: table has %d slots, want %d", n, m, maglevSize(n))
		}
		share := map[netip.Addr]int{}
		for _, a := range before {
			share[a]++
		}
		for a, c := range share {
			if float64(c) < 0.9*float64(m)/float64(n) || float64(c) > 1.1*float64(m)/float64(n) {
				t.Errorf("n=%d: %s owns %d of %d slots, want %d ± 10%%", n, a, c, m, m/n)
			}
		}
		// Remove backend 1.
		removed := append(append([]model.Backend(nil), bs[:1]...), bs[2:n]...)
		after := owners(removed, n) // the removed one is down: still configured
		moved, other := 0, 0
		for i := range before {
			if before[i] != after[i] {
				moved++
				if before[i] != bs[1].Addr {
					other++
				}
			}
		}
		frac := float64(moved) / float64(m)
		t.Logf("n=%d M=%d: removing one backend moved %.3f of slots (1/N = %.3f), %d not its own", n, m, frac, 1/float64(n), other)
		if frac > 1/float64(n)+0.04 || float64(other) > 0.04*float64(m) {
			t.Errorf("n=%d: removing one backend moved %.3f of slots (%d not its own), want about %.3f", n, frac, other, 1/float64(n))
		}
		// Add backend n (same table size while 100*(n+1) fits).
		if maglevSize(n+1) != m {
			continue
		}
		added := owners(bs[:n+1], n+1)
		moved, other = 0, 0
		for i := range before {
			if before[i] != added[i] {
				moved++
				if added[i] != bs[n].Addr {
					other++
				}
			}
		}
		frac = float64(moved) / float64(m)
		t.Logf("n=%d M=%d: adding one backend moved %.3f of slots (1/(N+1) = %.3f), %d between old backends", n, m, frac, 1/float64(n+1), other)
		if frac > 1/float64(n+1)+0.04 || float64(other) > 0.04*float64(m) {
			t.Errorf("n=%d: adding one backend moved %.3f of slots (%d between old backends), want about %.3f", n, frac, other, 1/float64(n+1))
		}
	}
}

// TestMaglevWeights: a backend of weight 3 owns about three times the slots
// of one of weight 1.
func TestMaglevWeights(t *testing.T) {
	bs := maglevBackends(2)
	bs[1].Weight = 3
	c := map[int]int{}
	for _, b := range maglevTable(bs, 2) {
		c[b]++
	}
	if r := float64(c[1]) / float64(c[0]); r < 2.7 || r > 3.3 {
		t.Errorf("weights 1:3 own %v slots, ratio %.2f", c, r)
	}
}
