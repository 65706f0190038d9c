package model

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

const tableNameRule = "1 to 63 characters of A-Z, a-z, 0-9, '_', '.', '-'"

// ValidTableName reports whether s may name a table.
func ValidTableName(s string) bool { return len(s) <= MaxTableNameLen && ValidName(s) }

// Validate checks a table's definition and that its entries fit its limit,
// and returns the first problem as a *FieldError. Entries are checked as
// they are added (ParseEntry), not here: Validate costs O(1).
func (t *Table) Validate() error {
	bad := func(field, value, problem string) error {
		return &FieldError{Object: tableObject(t.Name), Field: field, Value: value, Problem: problem}
	}
	if !ValidTableName(t.Name) {
		return &FieldError{Field: "name", Value: t.Name, Problem: "table names must be " + tableNameRule}
	}
	if int(t.Type) >= len(tableTypeSpec.names) {
		return bad("type", fmt.Sprint(t.Type), "allowed types are addr, number, iface, mac, flow:FIELDS")
	}
	if (t.Type == TableFlow) != (t.Flow != 0) {
		return bad("type", t.TypeString(), "a flow table needs one or more fields; other types take none")
	}
	if t.Flow&^(FlowSrcIP|FlowProto|FlowSrcPort|FlowDstIP|FlowDstPort) != 0 {
		return bad("type", t.TypeString(), "unknown flow field")
	}
	hasAddr := t.Type == TableAddr || t.Type == TableFlow && t.Flow&(FlowSrcIP|FlowDstIP) != 0
	if t.Family != FamilyDual && !hasAddr {
		return bad("family", t.Family.String(), "only tables with addresses (addr, flow with src-ip or dst-ip) take a family; leave it dual")
	}
	if int(t.Family) >= len(familySpec.names) {
		return bad("family", fmt.Sprint(t.Family), "allowed values are "+familySpec.allowed())
	}
	if t.Values>>len(valueFieldNames) != 0 {
		return bad("valtype", t.Values.String(), "allowed value fields are "+strings.Join(valueFieldNames, ", "))
	}
	if t.Limit > MaxTableEntries {
		return bad("limit", fmt.Sprint(t.Limit), fmt.Sprintf("must be 0 (no limit but the maximum, %d) to %d", MaxTableEntries, MaxTableEntries))
	}
	if t.Len() > t.MaxEntries() {
		return bad("limit", fmt.Sprint(t.Limit), fmt.Sprintf("the table holds %d entries, more than the limit", t.Len()))
	}
	if t.Timeout > MaxTableTimeout {
		return bad("timeout", fmt.Sprint(t.Timeout), fmt.Sprintf("must be 0 (entries do not expire) to %d seconds", MaxTableTimeout))
	}
	if int(t.Verdict) >= len(listVerdictSpec.names) {
		return bad("verdict", fmt.Sprint(t.Verdict), "allowed values are none, deny (blacklist), allow (whitelist)")
	}
	if len(t.LogPrefix) > MaxLogPrefixLen {
		return bad("log-prefix", t.LogPrefix, fmt.Sprintf("at most %d characters", MaxLogPrefixLen))
	}
	for _, c := range t.LogPrefix {
		if c < ' ' || c == '"' || c == '\\' || c >= 0x7f {
			return bad("log-prefix", t.LogPrefix, "printable ASCII characters only, without '\"' and '\\'")
		}
	}
	if t.Priority < 1 || t.Priority > MaxPriority {
		return bad("priority", fmt.Sprint(t.Priority), fmt.Sprintf("must be 1-%d", MaxPriority))
	}
	return nil
}

// EntryInput is an entry as a user wrote it, before it is checked against
// its table: key and value as text, and an optional timeout in seconds
// (nil: the table's default).
type EntryInput struct {
	Key     string
	Value   string
	Timeout *uint32
	// ValueSet says Value was given (an empty Value then means the zero
	// value); tables with values take the zero value when it was not.
	ValueSet bool
	// Expires, when not 0, is the entry's expiry as saved (Unix seconds):
	// a restore keeps it rather than starting the timeout again.
	Expires int64
}

// ParseEntry checks one entry against the table and returns it, or a
// *FieldError naming the table, the entry and what is allowed. now is the
// time its timeout counts from (Unix seconds).
func (t *Table) ParseEntry(in EntryInput, now int64) (TableEntry, error) {
	bad := func(field, value string, err error) error {
		return &FieldError{Object: entryObject(t.Name, in.Key), Field: field, Value: value, Problem: err.Error()}
	}
	k, err := t.ParseKey(in.Key)
	if err != nil {
		return TableEntry{}, bad("key", "", err)
	}
	v, err := t.ParseValue(in.Value)
	if err != nil {
		return TableEntry{}, bad("value", in.Value, err)
	}
	e := TableEntry{Key: k, Value: v}
	timeout := t.Timeout
	if in.Timeout != nil {
		timeout = *in.Timeout
		if timeout > MaxTableTimeout {
			return TableEntry{}, bad("timeout", fmt.Sprint(timeout), fmt.Errorf("must be 0 (no expiry) to %d seconds", MaxTableTimeout))
		}
	}
	switch {
	case in.Expires != 0:
		e.Expires = in.Expires
	case timeout > 0:
		e.Expires = now + int64(timeout)
	}
	return e, nil
}

// ParseEntryLine reads one line of a batch file (ipfw's "table T add"
// arguments): KEY [VALUE] [timeout SECONDS]. Blank lines and lines starting
// with '#' give ok false.
func ParseEntryLine(line string) (in EntryInput, ok bool, err error) {
	line = strings.TrimSpace(line)
	if line == "" || line[0] == '#' {
		return in, false, nil
	}
	f := strings.Fields(line)
	in.Key = f[0]
	f = f[1:]
	if len(f) > 0 && f[0] != "timeout" {
		in.Value, in.ValueSet = f[0], true
		f = f[1:]
	}
	if len(f) > 0 {
		if len(f) != 2 || f[0] != "timeout" {
			return in, false, fmt.Errorf("entry %q: a line is KEY [VALUE] [timeout SECONDS]", line)
		}
		n, err := strconv.ParseUint(f[1], 10, 32)
		if err != nil {
			return in, false, fmt.Errorf("entry %q: timeout must be a whole number of seconds", line)
		}
		t := uint32(n)
		in.Timeout = &t
	}
	return in, true, nil
}

// ExpiresText formats an expiry for listings: RFC 3339 in UTC, "" if none.
func ExpiresText(unix int64) string {
	if unix == 0 {
		return ""
	}
	return time.Unix(unix, 0).UTC().Format(time.RFC3339)
}

// BatchOptions change how a batch of entries is applied.
type BatchOptions struct {
	// Atomic: one bad entry refuses the whole batch (nothing changes).
	Atomic bool
	// Update: adding an entry that exists replaces its value instead of
	// failing with "entry exists".
	Update bool
}
