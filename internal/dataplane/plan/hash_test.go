package plan

import (
	"bytes"
	"net/netip"
	"slices"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
)

// TestFlowKeyLayout: the bytes hashed for each key set are nft's registers
// for `jhash <keys>`: fields in the order saddr, daddr, sport, dport, an
// address its 4 or 16 bytes, a port its 2 bytes in network order and 2
// zero bytes.
func TestFlowKeyLayout(t *testing.T) {
	v4 := Flow{Src: netip.MustParseAddr("10.0.0.7"), Dst: netip.MustParseAddr("192.0.2.10"), SPort: 443, DPort: 80}
	v6 := Flow{Src: netip.MustParseAddr("2001:db8::7"), Dst: netip.MustParseAddr("2001:db8::a"), SPort: 443, DPort: 80}
	s6, d6 := v6.Src.As16(), v6.Dst.As16()
	for _, c := range []struct {
		keys model.HashKey
		fl   Flow
		want []byte
	}{
		{model.KeySrcIP, v4, []byte{10, 0, 0, 7}},
		{model.KeyDstIP, v4, []byte{192, 0, 2, 10}},
		{model.KeySrcPort, v4, []byte{1, 187, 0, 0}},
		{model.KeyDstPort, v4, []byte{0, 80, 0, 0}},
		{model.KeySrcIP | model.KeySrcPort, v4, []byte{10, 0, 0, 7, 1, 187, 0, 0}},
		{model.KeySrcIP | model.KeyDstPort, v4, []byte{10, 0, 0, 7, 0, 80, 0, 0}},
		{model.KeySrcPort | model.KeyDstIP, v4, []byte{192, 0, 2, 10, 1, 187, 0, 0}},
		{model.KeySrcIP | model.KeyDstIP | model.KeySrcPort | model.KeyDstPort, v4,
			[]byte{10, 0, 0, 7, 192, 0, 2, 10, 1, 187, 0, 0, 0, 80, 0, 0}},
		// srcmac is not modelled (see HashTable): it adds nothing.
		{model.KeySrcIP | model.KeySrcMAC, v4, []byte{10, 0, 0, 7}},
		{model.KeySrcIP, v6, s6[:]},
		{model.KeySrcIP | model.KeySrcPort, v6, append(s6[:], 1, 187, 0, 0)},
		{model.KeySrcIP | model.KeyDstIP | model.KeySrcPort | model.KeyDstPort, v6,
			slices.Concat(s6[:], d6[:], []byte{1, 187, 0, 0, 0, 80, 0, 0})},
	} {
		if got := FlowKey(nil, c.keys, c.fl); !bytes.Equal(got, c.want) {
			t.Errorf("FlowKey(%s, %v) = %v, want %v", c.keys, c.fl.Src, got, c.want)
		}
	}
}

// hashPicks is what both planes do for the new flows of a hash farm.
func hashPicks(keys model.HashKey, active []model.Backend, fl []Flow) []netip.AddrPort {
	t := HashTable(active)
	out := make([]netip.AddrPort, len(fl))
	for i, x := range fl {
		b := active[t[FlowSlot(keys, x, len(t))]]
		out[i] = netip.AddrPortFrom(b.Addr, b.Port)
	}
	return out
}

// TestHashTableOrder: the table depends on the backend set, not on the
// order it is listed in, so nodes listing it differently agree.
func TestHashTableOrder(t *testing.T) {
	bs := backends(7)
	bs[2].Weight, bs[5].Weight = 3, 2
	rev := slices.Clone(bs)
	slices.Reverse(rev)
	fl := flows(5000)
	for _, keys := range []model.HashKey{model.KeySrcIP, model.KeySrcIP | model.KeySrcPort} {
		a, b := hashPicks(keys, bs, fl), hashPicks(keys, rev, fl)
		if !slices.Equal(a, b) {
			t.Errorf("%s: a reversed backend list picks other backends", keys)
		}
	}
}

// TestHashTableWeights: shares follow the weights (a flow hash over the
// weighted slots), every backend gets flows.
func TestHashTableWeights(t *testing.T) {
	bs := backends(3)
	bs[0].Weight, bs[1].Weight, bs[2].Weight = 1, 2, 5
	tab := HashTable(bs)
	if len(tab) != 8 {
		t.Fatalf("HashTable(weights 1, 2, 5) has %d slots, want 8", len(tab))
	}
	n := map[netip.AddrPort]int{}
	fl := flows(40000)
	for _, p := range hashPicks(model.KeySrcIP|model.KeySrcPort, bs, fl) {
		n[p]++
	}
	for i, w := range []float64{1, 2, 5} {
		share := float64(n[netip.AddrPortFrom(bs[i].Addr, bs[i].Port)]) / float64(len(fl))
		if want := w / 8; share < want-0.02 || share > want+0.02 {
			t.Errorf("backend %d (weight %v): share %.3f, want %.3f ± 0.02", i, w, share, want)
		}
	}
}
