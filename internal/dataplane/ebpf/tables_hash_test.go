package ebpf

import (
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
)

// TestHashKeys: a number, mac or flow entry's hash key reads back as the
// entry's key (what the counters answer with), fields a flow table does not
// have stay zero, and a number past 65535 gets no key.
func TestHashKeys(t *testing.T) {
	for _, c := range []struct{ typ, key string }{
		{"number", "443"},
		{"mac", "02:00:00:00:00:01"},
		{"flow:src-ip,proto,dst-port", "10.0.0.1,tcp,80"},
		{"flow:src-ip,src-port,dst-ip,dst-port", "fd00::1,1234,fd00::2,80"},
		{"flow:proto,dst-port", "udp,53"},
		{"flow:dst-ip", "192.0.2.1"},
	} {
		tt, ff, err := model.ParseTableType(c.typ)
		if err != nil {
			t.Fatal(err)
		}
		tb := model.NewTable("t", tt)
		tb.Flow = ff
		key, err := tb.ParseKey(c.key)
		if err != nil {
			t.Fatal(err)
		}
		h, ok := hashKey(&tb, key)
		if !ok {
			t.Errorf("%s %s: no hash key", c.typ, c.key)
			continue
		}
		if back := keyOfHash(&tb, h); back != key {
			t.Errorf("%s %s: reads back as %q", c.typ, c.key, tb.FormatKey(back))
		}
		if ff != 0 && ff&model.FlowSrcPort == 0 && h.Sport != 0 || ff != 0 && ff&(model.FlowSrcIP|model.FlowDstIP) == 0 && h.Family != 0 {
			t.Errorf("%s %s: fields the table lacks are set: %+v", c.typ, c.key, h)
		}
	}
	tb := model.NewTable("n", model.TableNumber)
	if _, ok := hashKey(&tb, model.NumberKey(70000)); ok {
		t.Error("number 70000 got a key; no port matches it")
	}
}
