package model

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func mustTable(t *testing.T, name, typ, valtype string) Table {
	t.Helper()
	tt, ff, err := ParseTableType(typ)
	if err != nil {
		t.Fatal(err)
	}
	tb := NewTable(name, tt)
	tb.Flow = ff
	if tb.Values, err = ParseValueFields(valtype); err != nil {
		t.Fatal(err)
	}
	if err := tb.Validate(); err != nil {
		t.Fatal(err)
	}
	return tb
}

func TestTableKeysRoundTrip(t *testing.T) {
	cases := []struct{ typ, in, out string }{
		{"addr", "10.0.0.1", "10.0.0.1"},
		{"addr", "10.0.0.0/8", "10.0.0.0/8"},
		{"addr", "10.0.0.1/32", "10.0.0.1"},
		{"addr", "fd00::/64", "fd00::/64"},
		{"addr", "fd00::1", "fd00::1"},
		{"number", "443", "443"},
		{"number", "0x10", "16"},
		{"number", "4294967295", "4294967295"},
		{"iface", "eth0", "eth0"},
		{"mac", "02:00:00:00:00:01", "02:00:00:00:00:01"},
		{"flow:src-ip,proto,dst-port", "10.0.0.1,tcp,80", "10.0.0.1,tcp,80"},
		{"flow:dst-port,src-ip", "fd00::1, 443", "fd00::1,443"},
		{"flow:proto,src-port", "17,53", "udp,53"},
		{"flow:src-ip,src-port,dst-ip,dst-port", "10.0.0.1,1000,10.0.0.2,80", "10.0.0.1,1000,10.0.0.2,80"},
	}
	for _, c := range cases {
		tb := mustTable(t, "t", c.typ, "")
		k, err := tb.ParseKey(c.in)
		if err != nil {
			t.Errorf("%s %q: %v", c.typ, c.in, err)
			continue
		}
		if got := tb.FormatKey(k); got != c.out {
			t.Errorf("%s %q: formatted %q, want %q", c.typ, c.in, got, c.out)
		}
	}
}

func TestTableKeyErrors(t *testing.T) {
	cases := []struct{ typ, in, want string }{
		{"addr", "10.0.0.0/33", "malformed prefix"},
		{"addr", "10.0.0.1/8", "did you mean 10.0.0.0/8"},
		{"addr", "eth0", "malformed address"},
		{"addr", "::ffff:10.0.0.1", "dotted form"},
		{"number", "-1", "0-4294967295"},
		{"number", "4294967296", "0-4294967295"},
		{"iface", "a/b", "interface names"},
		{"mac", "02:00:00:00:00", "aa:bb:cc:dd:ee:ff"},
		{"flow:src-ip,dst-port", "10.0.0.1", "1 fields given"},
		{"flow:src-ip,dst-port", "10.0.0.1,70000", "dst-port must be a port"},
		{"flow:src-ip,dst-ip", "10.0.0.1,fd00::1", "same family"},
		{"flow:proto", "gre2", "proto must be"},
	}
	for _, c := range cases {
		tb := mustTable(t, "t", c.typ, "")
		_, err := tb.ParseEntry(EntryInput{Key: c.in}, 0)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %q: error %v, want one containing %q", c.typ, c.in, err, c.want)
			continue
		}
		if !strings.Contains(err.Error(), `table "t" entry "`+c.in+`"`) {
			t.Errorf("%s %q: error %q does not name the table and entry", c.typ, c.in, err)
		}
	}
}

func TestTableFamily(t *testing.T) {
	tb := mustTable(t, "v4", "addr", "")
	tb.Family = FamilyIPv4
	if _, err := tb.ParseKey("fd00::1"); err == nil || !strings.Contains(err.Error(), "family ipv4") {
		t.Errorf("IPv6 key in an ipv4 table: %v", err)
	}
	n := mustTable(t, "n", "number", "")
	n.Family = FamilyIPv6
	if err := n.Validate(); err == nil || !strings.Contains(err.Error(), `field "family"`) {
		t.Errorf("family on a number table: %v", err)
	}
}

func TestTableValues(t *testing.T) {
	tb := mustTable(t, "t", "addr", "mark,farm,limit,dscp")
	for _, in := range []string{"mark=0x10,farm=web,limit=5,dscp=46", "16,web,5,46", "farm=web,mark=16,dscp=46,limit=5"} {
		v, err := tb.ParseValue(in)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		want := TableValue{Mark: 16, Farm: "web", Limit: 5, DSCP: 46}
		if *v != want {
			t.Errorf("%q: %+v, want %+v", in, *v, want)
		}
		if got := tb.FormatValue(v); got != "mark=16,farm=web,limit=5,dscp=46" {
			t.Errorf("%q formatted as %q", in, got)
		}
	}
	bad := map[string]string{
		"tag=1":            `not in the table's valtype (mark,farm,limit,dscp)`,
		"dscp=64":          "0-63",
		"mark=1,mark=2":    "given twice",
		"1,web,2,3,4":      "5 values given",
		"colour=red":       `unknown value field "colour"`,
		"mark=1,farm=a b!": "must be a name",
	}
	for in, want := range bad {
		if _, err := tb.ParseValue(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", in, err, want)
		}
	}
	plain := mustTable(t, "p", "addr", "")
	if _, err := plain.ParseValue("5"); err == nil || !strings.Contains(err.Error(), "without valtype") {
		t.Errorf("value in a table without values: %v", err)
	}
}

func TestTableValidate(t *testing.T) {
	long := strings.Repeat("a", 64)
	cases := []struct {
		mod  func(*Table)
		want string
	}{
		{func(t *Table) { t.Name = long }, "1 to 63 characters"},
		{func(t *Table) { t.Limit = MaxTableEntries + 1 }, `field "limit"`},
		{func(t *Table) { t.Priority = 0 }, `field "priority"`},
		{func(t *Table) { t.Type = TableFlow }, "needs one or more fields"},
		{func(t *Table) { t.Timeout = MaxTableTimeout + 1 }, `field "timeout"`},
		{func(t *Table) { t.LogPrefix = "a\"b" }, "printable ASCII"},
	}
	for _, c := range cases {
		tb := NewTable("t", TableAddr)
		c.mod(&tb)
		if err := tb.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want %q", err, c.want)
		}
	}
	tb := NewTable(strings.Repeat("a", 63), TableAddr)
	if err := tb.Validate(); err != nil {
		t.Errorf("63-character name: %v", err)
	}
}

func TestTableCloneIsolation(t *testing.T) {
	a := mustTable(t, "t", "addr", "")
	for i := range 1000 {
		e, err := a.ParseEntry(EntryInput{Key: fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)}, 0)
		if err != nil {
			t.Fatal(err)
		}
		a.PutEntry(e)
	}
	b := a.Clone()
	k, _ := b.ParseKey("192.168.0.0/16")
	b.PutEntry(TableEntry{Key: k})
	k0, _ := a.ParseKey("10.0.0.0/24")
	b.DeleteEntry(k0)
	if a.Len() != 1000 || b.Len() != 1000 {
		t.Fatalf("lengths %d and %d, want 1000 and 1000", a.Len(), b.Len())
	}
	if _, ok := a.Entry(k); ok {
		t.Error("an entry put into the clone shows in the original")
	}
	if _, ok := a.Entry(k0); !ok {
		t.Error("an entry deleted from the clone is gone from the original")
	}
	if _, ok := a.LookupAddr(netip.MustParseAddr("192.168.1.1")); ok {
		t.Error("the original's lookup finds the clone's entry")
	}
	if _, ok := b.LookupAddr(netip.MustParseAddr("192.168.1.1")); !ok {
		t.Error("the clone's lookup misses its own entry")
	}
}

func TestTableLookupMostSpecific(t *testing.T) {
	tb := mustTable(t, "t", "addr", "mark")
	for _, l := range []string{"10.0.0.0/8 1", "10.1.0.0/16 2", "10.1.2.0/24 3", "10.1.2.3 4", "fd00::/16 5", "fd00:1::/32 6", "0.0.0.0/0 7"} {
		in, _, _ := ParseEntryLine(l)
		e, err := tb.ParseEntry(in, 0)
		if err != nil {
			t.Fatal(err)
		}
		tb.PutEntry(e)
	}
	cases := map[string]uint32{
		"10.1.2.3": 4, "10.1.2.4": 3, "10.1.3.1": 2, "10.2.0.1": 1, "11.0.0.1": 7,
		"fd00:1::1": 6, "fd00:2::1": 5,
	}
	for addr, want := range cases {
		e, ok, err := tb.Lookup(addr)
		if err != nil || !ok || e.Value.Mark != want {
			t.Errorf("lookup %s: %+v %v %v, want mark %d", addr, e, ok, err, want)
		}
	}
	if _, ok, _ := tb.Lookup("fe80::1"); ok {
		t.Error("fe80::1 matched though no IPv6 prefix holds it")
	}
	// Deleting the only /24 makes lookups fall back to the /16.
	k, _ := tb.ParseKey("10.1.2.0/24")
	tb.DeleteEntry(k)
	if e, _, _ := tb.Lookup("10.1.2.4"); e.Value.Mark != 2 {
		t.Errorf("after deleting the /24: mark %d, want 2", e.Value.Mark)
	}
}

func TestParseEntryLine(t *testing.T) {
	in, ok, err := ParseEntryLine("  10.0.0.0/8 mark=5 timeout 60 ")
	if err != nil || !ok || in.Key != "10.0.0.0/8" || in.Value != "mark=5" || in.Timeout == nil || *in.Timeout != 60 {
		t.Errorf("got %+v %v %v", in, ok, err)
	}
	if _, ok, _ := ParseEntryLine("# comment"); ok {
		t.Error("a comment is an entry")
	}
	if _, _, err := ParseEntryLine("10.0.0.1 5 timeout"); err == nil {
		t.Error("timeout without seconds accepted")
	}
}

func TestTableJSONRoundTrip(t *testing.T) {
	body := `{"tables":[{"name":"acl","type":"addr","valtype":"mark,farm","limit":"100","verdict":"deny","entries":[
		{"key":"10.0.0.0/8","value":{"mark":"16","farm":"web"}},{"key":"fd00::1","value":"mark=1"},{"key":"10.9.0.0/16","expires":"2030-01-02T03:04:05Z"}]}]}`
	none := func(string) (*Table, bool) { return nil, false }
	tds, err := DecodeTables([]byte(body), none, VocabTables)
	if err != nil {
		t.Fatal(err)
	}
	td := tds[0]
	if !td.HasEntries || len(td.Entries) != 3 || td.Table.Limit != 100 || td.Table.Verdict != ListDeny {
		t.Fatalf("decoded %+v", td)
	}
	tb := td.Table
	for _, in := range td.Entries {
		e, err := tb.ParseEntry(in, 0)
		if err != nil {
			t.Fatal(err)
		}
		tb.PutEntry(e)
	}
	out := tb.AppendJSON(nil, VocabTables, true, 0, 0)
	var v map[string]any
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	want := `{"name":"acl","type":"addr","family":"dual","valtype":"mark,farm","limit":"100","locked":"false","timeout":"0","verdict":"deny","log-prefix":"","priority":"1","count":"3","entries":[` +
		`{"key":"10.0.0.0/8","value":{"mark":"16","farm":"web"}},{"key":"10.9.0.0/16","value":{"mark":"0","farm":""},"expires":"2030-01-02T03:04:05Z"},{"key":"fd00::1","value":{"mark":"1","farm":""}}]}`
	if string(out) != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
	// The output decodes back to the same table.
	tds, err = DecodeTables(out, none, VocabTables)
	if err != nil || len(tds[0].Entries) != 3 {
		t.Fatalf("re-decode: %v", err)
	}
}

func TestPolicyVocabulary(t *testing.T) {
	none := func(string) (*Table, bool) { return nil, false }
	tds, err := DecodeTables([]byte(`{"policies":[{"name":"bl","type":"whitelist","family":"ipv4","route":"in","timeout":"30","elements":[{"data":"192.168.1.0/24"},{"data":"10.0.0.1","time":"5"}]}]}`), none, VocabPolicies)
	if err != nil {
		t.Fatal(err)
	}
	tb := tds[0].Table
	if tb.Verdict != ListAllow || tb.Type != TableAddr || tb.Family != FamilyIPv4 || tb.Timeout != 30 {
		t.Fatalf("decoded %+v", tb)
	}
	for _, in := range tds[0].Entries {
		e, err := tb.ParseEntry(in, 1000)
		if err != nil {
			t.Fatal(err)
		}
		tb.PutEntry(e)
	}
	got := string(tb.AppendJSON(nil, VocabPolicies, true, 2, 1000))
	want := `{"name":"bl","type":"whitelist","family":"ipv4","route":"in","timeout":"30","priority":"1","log-prefix":"","used":"2","elements":[{"data":"10.0.0.1","time":"5"},{"data":"192.168.1.0/24","time":"30"}]}`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	// A new policy without type is a blacklist (nftlb's default).
	tds, err = DecodeTables([]byte(`{"name":"x"}`), none, VocabPolicies)
	if err != nil || tds[0].Table.Verdict != ListDeny {
		t.Errorf("default type: %+v %v", tds, err)
	}
	if _, err := DecodeTables([]byte(`{"name":"x","type":"greylist"}`), none, VocabPolicies); err == nil || !strings.Contains(err.Error(), "blacklist, whitelist") {
		t.Errorf("bad type: %v", err)
	}
}

func TestTableDecodeErrors(t *testing.T) {
	cur := NewTable("old", TableAddr)
	lookup := func(n string) (*Table, bool) { return &cur, n == "old" }
	cases := map[string]string{
		`{"name":"t","colour":"red"}`:            `unknown field`,
		`{"name":"old","type":"number"}`:         `cannot be changed once the table exists`,
		`{"name":"t","type":"flow"}`:             `needs its fields`,
		`{"name":"t","valtype":"mark,colour"}`:   `value field "colour"`,
		`{"name":"t","limit":"-1"}`:              `field "limit"`,
		`{"name":"t","entries":[{"value":"1"}]}`: `every entry needs a key`,
		`{"tables":[{"name":"a"},{"name":"a"}]}`: `appears twice`,
	}
	for body, want := range cases {
		if _, err := DecodeTables([]byte(body), lookup, VocabTables); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", body, err, want)
		}
	}
}

func TestSplitState(t *testing.T) {
	farms, tables, err := SplitState([]byte(`{"farms":[{"name":"f"}],"tables":[{"name":"t","entries":[{"key":"10.0.0.1"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if string(farms) != `{"farms":[{"name":"f"}]}` || len(tables) != 1 || len(tables[0].Entries) != 1 {
		t.Errorf("farms %s tables %+v", farms, tables)
	}
	farms, tables, _ = SplitState([]byte(`{"farms":[{"name":"tables"}]}`))
	if string(farms) != `{"farms":[{"name":"tables"}]}` || tables != nil {
		t.Errorf("a farm named tables: %s %v", farms, tables)
	}
}
