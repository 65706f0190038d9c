package nft

import (
	"encoding/binary"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TestSetElemsDecode: the in-place decoder of a counter set dump finds each
// element's key and counter, with the counter as the one expression
// (NFTA_SET_ELEM_EXPR) or in a list (NFTA_SET_ELEM_EXPRESSIONS, with
// another expression first), and skips an element without a counter.
func TestSetElemsDecode(t *testing.T) {
	u64 := func(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
	enc := func(as ...netlink.Attribute) []byte {
		b, err := netlink.MarshalAttributes(as)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	nested := func(typ uint16, as ...netlink.Attribute) netlink.Attribute {
		return netlink.Attribute{Type: unix.NLA_F_NESTED | typ, Data: enc(as...)}
	}
	counter := func(typ uint16, pkts, bytes uint64) netlink.Attribute {
		return nested(typ,
			netlink.Attribute{Type: unix.NFTA_EXPR_NAME, Data: []byte("counter\x00")},
			nested(unix.NFTA_EXPR_DATA,
				netlink.Attribute{Type: unix.NFTA_COUNTER_BYTES, Data: u64(bytes)},
				netlink.Attribute{Type: unix.NFTA_COUNTER_PACKETS, Data: u64(pkts)}))
	}
	key := func(k string) netlink.Attribute {
		return nested(unix.NFTA_SET_ELEM_KEY, netlink.Attribute{Type: unix.NFTA_DATA_VALUE, Data: []byte(k)})
	}
	other := nested(unix.NFTA_LIST_ELEM, netlink.Attribute{Type: unix.NFTA_EXPR_NAME, Data: []byte("limit\x00")})
	msg := enc(
		netlink.Attribute{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: []byte("xlb-counters\x00")},
		nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS,
			nested(unix.NFTA_LIST_ELEM, key("abcd"), counter(unix.NFTA_SET_ELEM_EXPR, 3, 300)),
			nested(unix.NFTA_LIST_ELEM, key("efg"), nested(nftaSetElemExpressions, other, counter(unix.NFTA_LIST_ELEM, 5, 500))),
			nested(unix.NFTA_LIST_ELEM, key("none"))))
	got := map[string]ctrVal{}
	setElems(msg, func(k []byte, v ctrVal) { got[string(k)] = v })
	want := map[string]ctrVal{"abcd": {3, 300}, "efg": {5, 500}}
	if len(got) != len(want) || got["abcd"] != want["abcd"] || got["efg"] != want["efg"] {
		t.Fatalf("decoded %v, want %v", got, want)
	}
	// A truncated message yields what is whole and stops.
	setElems(msg[:len(msg)-3], func([]byte, ctrVal) {})
}
