package store

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// bigFarm returns farm name with n backends, sealed as the engine's are.
func bigFarm(t testing.TB, name string, n, weight int) *model.Farm {
	var b strings.Builder
	fmt.Fprintf(&b, `{"name":%q,"virtual-addr":"10.1.1.1","virtual-ports":"80","backends":[`, name)
	for j := range n {
		if j > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"b%d","ip-addr":"172.16.%d.%d","port":"8080","weight":"%d"}`, j, j>>8, j&255, weight)
	}
	b.WriteString("]}")
	fs, err := model.DecodeFarms([]byte(b.String()), func(string) (*model.Farm, bool) { return nil, false })
	if err != nil {
		t.Fatal(err)
	}
	fs[0].Seal()
	return &fs[0]
}

// BenchmarkEncodeRecordAddFarm100Backends is the journal record of an
// API call that adds a farm of 100 backends.
func BenchmarkEncodeRecordAddFarm100Backends(b *testing.B) {
	d := plan.Diff{Changes: []plan.FarmChange{{New: bigFarm(b, "web", 100, 1)}}}
	b.ReportAllocs()
	for b.Loop() {
		encodeRecord(d)
	}
}

// refEncodeRecord is encodeRecord as it was before it built the record in
// one buffer: the bytes must not change (old journals are read back).
func refEncodeRecord(d plan.Diff) []byte {
	entry := func(buf []byte, name string, v []byte) []byte {
		buf = binary.AppendUvarint(buf, uint64(len(name)))
		buf = append(buf, name...)
		if v == nil {
			return binary.AppendUvarint(buf, 0)
		}
		buf = binary.AppendUvarint(buf, uint64(len(v))+1)
		return append(buf, v...)
	}
	var undo []byte
	seen := map[string]bool{}
	rec := func(name string, old []byte) {
		if !seen[name] {
			seen[name] = true
			undo = entry(undo, name, old)
		}
	}
	for _, c := range d.Changes {
		if c.Old != nil {
			rec(c.Old.Name, c.Old.AppendJSON(nil))
		}
		if c.New != nil {
			rec(c.New.Name, nil)
		}
	}
	var redo []byte
	last := map[string]int{}
	type ent struct {
		name string
		v    []byte
	}
	var entries []ent
	set := func(name string, v []byte) {
		if i, ok := last[name]; ok {
			entries[i].v = v
			return
		}
		last[name] = len(entries)
		entries = append(entries, ent{name, v})
	}
	for _, c := range d.Changes {
		if c.Old != nil && (c.New == nil || c.New.Name != c.Old.Name) {
			set(c.Old.Name, nil)
		}
		if c.New != nil {
			set(c.New.Name, c.New.AppendJSON(nil))
		}
	}
	for _, e := range entries {
		redo = entry(redo, e.name, e.v)
	}
	payload := binary.AppendUvarint(make([]byte, recordHeader), uint64(len(redo)))
	payload = append(append(payload, redo...), undo...)
	binary.LittleEndian.PutUint32(payload, uint32(len(payload)-recordHeader))
	binary.LittleEndian.PutUint32(payload[4:], crc32.Checksum(payload[recordHeader:], castagnoli))
	return payload
}

func TestEncodeRecordBytes(t *testing.T) {
	a1, a2 := bigFarm(t, "a", 100, 1), bigFarm(t, "a", 100, 2)
	b1, long := bigFarm(t, "b", 1, 1), bigFarm(t, strings.Repeat("x", 64), 300, 3)
	unsealed := *bigFarm(t, "u", 2, 1)
	unsealed.Backends = append([]model.Backend(nil), unsealed.Backends...)
	for i, d := range []plan.Diff{
		{Changes: []plan.FarmChange{{New: a1}}},
		{Changes: []plan.FarmChange{{Old: a1}}},
		{Changes: []plan.FarmChange{{Old: a1, New: a2}, {New: b1}, {Old: long}}},
		{Changes: []plan.FarmChange{{Old: a1, New: a2}, {Old: a2, New: a1}, {New: long}, {Old: long, New: b1}}},
		{Changes: []plan.FarmChange{{New: &unsealed}, {Old: b1}}},
		{},
	} {
		got, want := encodeRecord(d), refEncodeRecord(d)
		if string(got) != string(want) {
			t.Errorf("diff %d: the record changed (%d bytes, want %d)", i, len(got), len(want))
		}
		if u, w := encodeUndo(d), want; len(d.Changes) > 0 && !strings.HasSuffix(string(w), string(u)) {
			t.Errorf("diff %d: encodeUndo is not the record's undo list", i)
		}
	}
}
