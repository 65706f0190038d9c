package nft

import (
	"testing"

	"github.com/google/nftables"

	"github.com/xlb-lb/xlb/internal/model"
)

// TestOtherSlotKeys: each key type's kernel element has the size of the
// set's key type, and reads back as the entry's key (what the counters
// answer with); a number past 65535 gets no element.
func TestOtherSlotKeys(t *testing.T) {
	for _, c := range []struct {
		typ  string
		keys []string
		fam  uint8
	}{
		{"number", []string{"0", "80", "65535"}, 0},
		{"iface", []string{"eth0", "a-long-name.15"}, 0},
		{"mac", []string{"02:00:00:00:00:01"}, 0},
		{"flow:src-ip,proto,dst-port", []string{"10.0.0.1,tcp,80"}, 4},
		{"flow:src-ip,proto,dst-port", []string{"fd00::1,udp,53"}, 6},
		{"flow:src-ip,src-port,dst-ip,dst-port", []string{"fd00::1,1234,fd00::2,80"}, 6},
		{"flow:proto,dst-port", []string{"udp,53"}, 0},
		{"flow:src-port", []string{"1234"}, 0},
		{"flow:dst-ip", []string{"192.0.2.1"}, 4},
	} {
		tt, ff, err := model.ParseTableType(c.typ)
		if err != nil {
			t.Fatal(err)
		}
		tb := model.NewTable("t", tt)
		tb.Flow = ff
		o := newOtherSlot(&tb)
		for _, k := range c.keys {
			key, err := tb.ParseKey(k)
			if err != nil {
				t.Fatalf("%s %s: %v", c.typ, k, err)
			}
			el, fam, ok := o.elemKey(key)
			if !ok || fam != c.fam {
				t.Errorf("%s %s: element ok %v family %d, want family %d", c.typ, k, ok, fam, c.fam)
				continue
			}
			kt := o.keyType(fam)
			if want := int(kt.Bytes); len(el) != want && !(tt == model.TableNumber && len(el) == 2) {
				t.Errorf("%s %s: element of %d bytes, the set's key type %s has %d", c.typ, k, len(el), kt.Name, want)
			}
			if len(nftables.ConcatSetTypeElements(kt)) > 1 && len(el)%4 != 0 {
				t.Errorf("%s %s: a concatenated key of %d bytes (fields are padded to 4)", c.typ, k, len(el))
			}
			back, ok := o.keyOf(el, fam)
			if !ok || back != key {
				t.Errorf("%s %s: element reads back as %q (%v), want %q", c.typ, k, tb.FormatKey(back), ok, k)
			}
		}
	}
	tb := model.NewTable("n", model.TableNumber)
	if _, _, ok := newOtherSlot(&tb).elemKey(model.NumberKey(70000)); ok {
		t.Error("number 70000 got an element; no port matches it")
	}
}
