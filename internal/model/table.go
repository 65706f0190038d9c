package model

import (
	"fmt"
	"strings"
)

// Named tables, as FreeBSD ipfw has them ("LOOKUP TABLES" in ipfw(8)): a
// table has a name, a key type, optional multi-field values per entry, a
// size limit and a lock. nftlb's blacklist/whitelist policies are tables
// with a verdict: one Table type inside, two vocabularies outside (the
// /tables routes and the nftlb /policies routes).
//
// A Table is immutable once handed to the engine, like a Farm: changes
// build a new Table whose entries share all unchanged parts with the old
// one (entries.go), so a published snapshot costs O(changed) to update even
// at a million entries.

// TableType is what a table's keys are.
type TableType uint8

const (
	// TableAddr: IPv4 and IPv6 addresses and prefixes; a lookup returns
	// the most specific entry.
	TableAddr TableType = iota
	// TableNumber: 32-bit numbers (ports, marks, ...).
	TableNumber
	// TableIface: network interface names.
	TableIface
	// TableMAC: Ethernet addresses.
	TableMAC
	// TableFlow: a chosen subset of the 5-tuple (see FlowFields).
	TableFlow
)

var tableTypeSpec = enumSpec[TableType]{[]string{"addr", "number", "iface", "mac", "flow"}}

func (t TableType) String() string { return tableTypeSpec.name(t) }

// FlowFields are the packet fields a flow table's key holds, in this order.
type FlowFields uint8

const (
	FlowSrcIP FlowFields = 1 << iota
	FlowProto
	FlowSrcPort
	FlowDstIP
	FlowDstPort
)

var flowFieldNames = []string{"src-ip", "proto", "src-port", "dst-ip", "dst-port"}

// String returns the fields as ipfw writes them: "src-ip,proto,dst-port".
func (f FlowFields) String() string { return joinBits(uint8(f), flowFieldNames) }

// ValueFields are the typed fields an entry's value holds (ipfw's
// multi-field values, "valtype"), in this order.
type ValueFields uint8

const (
	// ValMark sets the packet (and connection) mark.
	ValMark ValueFields = 1 << iota
	// ValFarm sends a matching client to that farm.
	ValFarm
	// ValBackend sends a matching client to that backend of its farm.
	ValBackend
	// ValLimit is a per-key rate: new connections per second.
	ValLimit
	// ValDSCP sets the DSCP bits of the packet.
	ValDSCP
	// ValTag is a 32-bit tag (ipfw's tag), for the user's own rules.
	ValTag
)

var valueFieldNames = []string{"mark", "farm", "backend", "limit", "dscp", "tag"}

// String returns the fields as ipfw writes them: "mark,farm".
func (v ValueFields) String() string { return joinBits(uint8(v), valueFieldNames) }

// ListVerdict is what a farm does with a client found in a table attached
// to it as a policy (nftlb's policy "type": a deny list or an allow list).
type ListVerdict uint8

const (
	// ListNone: the table is not a policy.
	ListNone ListVerdict = iota
	// ListDeny drops matching clients (nftlb: blacklist).
	ListDeny
	// ListAllow admits only matching clients (nftlb: whitelist).
	ListAllow
)

var listVerdictSpec = enumSpec[ListVerdict]{[]string{"none", "deny", "allow"}}

// policyTypeSpec is nftlb's vocabulary for the same verdicts.
var policyTypeSpec = enumSpec[ListVerdict]{[]string{"", "blacklist", "whitelist"}}

func (v ListVerdict) String() string { return listVerdictSpec.name(v) }

// PolicyType is the verdict in nftlb's words: blacklist, whitelist ("" for
// none).
func (v ListVerdict) PolicyType() string { return policyTypeSpec.name(v) }

// Limits of tables.
const (
	// MaxTableNameLen is ipfw's limit on table names.
	MaxTableNameLen = 63
	// MaxTables is how many tables may exist at once (ipfw's 65,535).
	MaxTables = 65535
	// MaxTableEntries bounds one table; a table's own limit may be lower.
	MaxTableEntries = 16 << 20
	// MaxTableTimeout bounds a per-entry timeout, in seconds (a year).
	MaxTableTimeout = 365 * 24 * 3600
)

// Table is a named lookup table. Name, Type, Flow, Family and Values are
// fixed at creation; Limit, Locked, Timeout and the policy fields may be
// modified; entries change through the engine's batch operations.
type Table struct {
	Name string
	Type TableType
	// Flow is the key's fields for Type TableFlow (0 otherwise).
	Flow FlowFields
	// Family restricts address keys (and flow keys' addresses) to IPv4 or
	// IPv6; FamilyDual admits both.
	Family Family
	// Values are the fields each entry's value carries (0: no values).
	Values ValueFields
	// Limit is the most entries the table may hold; 0 means
	// MaxTableEntries.
	Limit uint32
	// Locked refuses every change but unlock (ipfw's lock).
	Locked bool
	// Timeout is the default lifetime of a new entry, in seconds (0: entries
	// do not expire unless they say so).
	Timeout uint32

	// Policy fields (nftlb): what farms using the table as a policy do
	// with a matching client, the prefix of their log lines, and the
	// order among a farm's policies (lower first).
	Verdict   ListVerdict
	LogPrefix string
	Priority  uint32

	// ID identifies the table to the data planes (farms refer to it by
	// ID); Slot is the kernel storage that holds its entries. The engine
	// assigns both; a swap exchanges the Slots of two tables, which is
	// how it costs O(1) in the kernel. Both are saved so a restarted
	// daemon finds the kernel objects it made.
	ID   uint16
	Slot uint32

	entries entrySet
}

// NewTable returns an empty table of that type with the defaults: both
// address families, no values, no limit below MaxTableEntries, priority 1.
func NewTable(name string, typ TableType) Table {
	return Table{Name: name, Type: typ, Family: FamilyDual, Priority: 1}
}

// Len is the number of entries.
func (t *Table) Len() int { return t.entries.len() }

// MaxEntries is the table's effective limit.
func (t *Table) MaxEntries() int {
	if t.Limit == 0 {
		return MaxTableEntries
	}
	return int(t.Limit)
}

// IsPolicy reports whether the table has a verdict (nftlb's policies).
func (t *Table) IsPolicy() bool { return t.Verdict != ListNone }

// Attachable reports whether farms may attach the table (a farm's
// "policies"): it has a verdict, or it is an addr table with values the
// data path applies to the clients it matches (mark, limit, dscp), or both.
func (t *Table) Attachable() bool {
	return t.IsPolicy() || t.Type == TableAddr && t.Values&(ValMark|ValLimit|ValDSCP) != 0
}

// Clone returns a copy that shares the entries; changes to the copy's
// entries (through a TableEdit) never show in t.
func (t *Table) Clone() Table {
	c := *t
	c.entries = t.entries.clone()
	return c
}

// WithEntriesOf returns a copy of t holding o's entries (and o's Slot):
// one side of a swap. Nothing is copied entry by entry.
func (t *Table) WithEntriesOf(o *Table) Table {
	c := *t
	c.entries = o.entries.clone()
	c.Slot = o.Slot
	return c
}

// SameKind reports whether two tables hold the same kind of entries (what
// swap requires): type, flow fields and value fields.
func (t *Table) SameKind(o *Table) bool {
	return t.Type == o.Type && t.Flow == o.Flow && t.Values == o.Values
}

// KindString describes the kind: "addr", "flow:src-ip,dst-port valtype mark".
func (t *Table) KindString() string {
	s := t.Type.String()
	if t.Type == TableFlow {
		s += ":" + t.Flow.String()
	}
	if t.Values != 0 {
		s += " valtype " + t.Values.String()
	}
	return s
}

// SameSpec reports whether two tables have the same definition apart from
// their entries, ID and Slot.
func (t *Table) SameSpec(o *Table) bool {
	a, b := *t, *o
	a.entries, b.entries = entrySet{}, entrySet{}
	a.ID, b.ID, a.Slot, b.Slot = 0, 0, 0, 0
	return a == b
}

func tableObject(name string) string { return fmt.Sprintf("table %q", name) }

func entryObject(table, key string) string {
	return fmt.Sprintf("table %q entry %q", table, key)
}

// joinBits names the set bits of v, comma-separated, in bit order.
func joinBits(v uint8, names []string) string {
	var parts []string
	for i, n := range names {
		if v&(1<<i) != 0 {
			parts = append(parts, n)
		}
	}
	return strings.Join(parts, ",")
}

// parseBits parses a comma-separated list of names into bits; it returns
// the first unknown or repeated name.
func parseBits(v string, names []string) (uint8, string, bool) {
	var out uint8
	for _, w := range strings.Split(v, ",") {
		w = strings.TrimSpace(w)
		i := indexOf(names, w)
		if i < 0 || out&(1<<i) != 0 {
			return 0, w, false
		}
		out |= 1 << i
	}
	return out, "", true
}

func indexOf(names []string, w string) int {
	for i, n := range names {
		if n == w {
			return i
		}
	}
	return -1
}

// ParseTableType parses "addr", "number", "iface", "mac" or
// "flow:src-ip,proto,src-port,dst-ip,dst-port" (any non-empty subset, in
// any order).
func ParseTableType(v string) (TableType, FlowFields, error) {
	name, fields, hasFields := strings.Cut(v, ":")
	t, ok := tableTypeSpec.parse(strings.TrimSpace(name))
	if !ok {
		return 0, 0, fmt.Errorf("allowed types are addr, number, iface, mac, flow:FIELDS (FIELDS: %s, comma-separated)", strings.Join(flowFieldNames, ","))
	}
	switch {
	case t == TableFlow && !hasFields:
		return 0, 0, fmt.Errorf("type flow needs its fields: flow:FIELDS, FIELDS one or more of %s, comma-separated", strings.Join(flowFieldNames, ","))
	case t != TableFlow && hasFields:
		return 0, 0, fmt.Errorf("only type flow takes fields after ':'")
	case t != TableFlow:
		return t, 0, nil
	}
	bits, bad, ok := parseBits(fields, flowFieldNames)
	if !ok {
		return 0, 0, fmt.Errorf("flow field %q is unknown or repeated; allowed: %s", bad, strings.Join(flowFieldNames, ", "))
	}
	return t, FlowFields(bits), nil
}

// TypeString is the type as ParseTableType reads it.
func (t *Table) TypeString() string {
	if t.Type == TableFlow {
		return "flow:" + t.Flow.String()
	}
	return t.Type.String()
}

// ParseValueFields parses ipfw's valtype: "mark,farm" (or "" for none).
func ParseValueFields(v string) (ValueFields, error) {
	if strings.TrimSpace(v) == "" || v == "none" {
		return 0, nil
	}
	bits, bad, ok := parseBits(v, valueFieldNames)
	if !ok {
		return 0, fmt.Errorf("value field %q is unknown or repeated; allowed: %s (comma-separated), or none", bad, strings.Join(valueFieldNames, ", "))
	}
	return ValueFields(bits), nil
}

// ParseVerdict parses a verdict in either vocabulary: none, deny, allow,
// blacklist, whitelist.
func ParseVerdict(v string) (ListVerdict, bool) {
	if x, ok := listVerdictSpec.parse(v); ok {
		return x, true
	}
	if x, ok := policyTypeSpec.parse(v); ok && v != "" {
		return x, true
	}
	return 0, false
}
