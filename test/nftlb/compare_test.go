package nftlb

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
)

// How GET output is compared: every member nftlb prints must be printed
// by xlb with the same value (nftlb's trailing spaces in multi-word values
// trimmed), except the values listed in quirks, each a documented
// difference (docs/nftlb-compat.md, "GET values"). xlb prints every field;
// the members nftlb leaves out when unset are listed in extraXlb.

// quirk reports whether a value differs for a documented reason; parent
// is the nftlb object holding the member.
type quirk func(path, key string, nftlb, xlb any, parent map[string]any) bool

var quirks = []struct {
	why string
	is  quirk
}{
	{"nftlb gives backends marks of its own (0x1, 0x2, ...) when it masquerades; xlb prints the configured mark",
		func(path, key string, n, x any, _ map[string]any) bool {
			return strings.Contains(path, ".backends[") && key == "mark" && x == "0x0"
		}},
	{"nftlb prints config_error for objects it could not program; xlb programs them (or refuses the request) and prints their state",
		func(path, key string, n, x any, _ map[string]any) bool { return key == "state" && n == "config_error" }},
	{"a policy without a family: nftlb's holds IPv4 elements only, xlb's both families (it prints dual)",
		func(path, key string, n, x any, _ map[string]any) bool {
			return strings.HasPrefix(path, ".policies[") && key == "family" && n == "ipv4" && x == "dual"
		}},
	{"a farm's priority is the level both compute from their backends (nftlb's rule), but nftlb counts its backends in config_error as down",
		func(path, key string, n, x any, parent map[string]any) bool {
			if key != "priority" || strings.Contains(path, ".backends[") || strings.HasPrefix(path, ".policies[") {
				return false
			}
			bs, _ := parent["backends"].([]any)
			for _, b := range bs {
				if o, _ := b.(map[string]any); o["state"] == "config_error" {
					return true
				}
			}
			return false
		}},
	{"nftlb 1.0.7 prints rst-rtlimit in new-rtlimit's unit (config.c passes newrtlimit_unit); the rule it programs has the right unit, as xlb prints it",
		func(path, key string, n, x any, _ map[string]any) bool {
			ns, _ := n.(string)
			xs, _ := x.(string)
			nr, _, _ := strings.Cut(ns, "/")
			xr, _, _ := strings.Cut(xs, "/")
			return key == "rst-rtlimit" && nr == xr
		}},
}

// extraXlb are members xlb prints that nftlb leaves out when unset (or has
// no such field): xlb prints every field, defaults filled in.
var extraXlb = map[string]bool{
	"log-prefix": true, "new-rtlimit-log-prefix": true, "rst-rtlimit-log-prefix": true, "est-connlimit-log-prefix": true,
	"tcp-strict-log-prefix": true, "flow-offload": true, "intra-connect": true, "iface": true, "oface": true,
	"ether-addr": true, "source-addr": true,
	// nftlb prints responsettl for stlsdnat farms only.
	"responsettl": true,
	// A farm without an address: nftlb leaves out what its address holds.
	"family": true, "virtual-addr": true, "virtual-ports": true, "protocol": true,
	// A policy's order among a farm's policies: nftlb 1.0.7 has none
	// (later nftlb has it).
	"priority": true,
}

// missingXlb are members nftlb prints that xlb does not, each with its
// reason (docs/nftlb-compat.md).
var missingXlb = map[string]string{
	"counter-packets": "per-element counters of a policy: the nft plane keeps none; the eBPF plane's are at GET /tables/{name}/counters",
	"counter-bytes":   "per-element counters of a policy: the nft plane keeps none; the eBPF plane's are at GET /tables/{name}/counters",
}

// compareJSON compares nftlb's and xlb's GET output; it returns the
// differences that no quirk explains, and the quirks seen.
func compareJSON(nftlbBody, xlbBody string) (diffs []string, seen map[string]bool) {
	var n, x any
	if err := json.Unmarshal([]byte(nftlbBody), &n); err != nil {
		return []string{fmt.Sprintf("nftlb's body is not JSON: %v: %s", err, nftlbBody)}, nil
	}
	if err := json.Unmarshal([]byte(xlbBody), &x); err != nil {
		return []string{fmt.Sprintf("xlb's body is not JSON: %v: %s", err, xlbBody)}, nil
	}
	seen = map[string]bool{}
	var walk func(path string, n, x any)
	walk = func(path string, n, x any) {
		switch nv := n.(type) {
		case map[string]any:
			xv, ok := x.(map[string]any)
			if !ok {
				diffs = append(diffs, fmt.Sprintf("%s: nftlb an object, xlb %v", path, x))
				return
			}
			for _, k := range sortedKeys(nv) {
				xe, ok := xv[k]
				if why, known := missingXlb[k]; !ok && known {
					seen[why] = true
					continue
				}
				if !ok {
					diffs = append(diffs, fmt.Sprintf("%s.%s: printed by nftlb (%v), not by xlb", path, k, nv[k]))
					continue
				}
				if s, isStr := nv[k].(string); isStr {
					// A value of the user's own may end in a space
					// (a log prefix): equal as sent counts too.
					if want := strings.TrimSpace(s); want != xe && s != xe {
						explained := false
						for _, q := range quirks {
							if q.is(path, k, want, xe, nv) {
								seen[q.why], explained = true, true
							}
						}
						if !explained {
							diffs = append(diffs, fmt.Sprintf("%s.%s: nftlb %q, xlb %q", path, k, want, xe))
						}
					}
					continue
				}
				walk(path+"."+k, nv[k], xe)
			}
			for k := range xv {
				if _, ok := nv[k]; !ok && !extraXlb[k] {
					diffs = append(diffs, fmt.Sprintf("%s.%s: printed by xlb (%v), not by nftlb", path, k, xv[k]))
				}
			}
		case []any:
			xv, ok := x.([]any)
			if !ok || len(xv) != len(nv) {
				diffs = append(diffs, fmt.Sprintf("%s: nftlb %d items, xlb %v", path, len(nv), x))
				return
			}
			// Lists of named objects are compared by name: nftlb keeps
			// creation order, xlb name order.
			byName := func(l []any) map[string]any {
				m := map[string]any{}
				for _, e := range l {
					if o, ok := e.(map[string]any); ok {
						if name, ok := o["name"].(string); ok {
							m[name] = e
						}
					}
				}
				return m
			}
			nm, xm := byName(nv), byName(xv)
			if len(nm) == len(nv) {
				for _, name := range sortedKeys(nm) {
					if xm[name] == nil {
						diffs = append(diffs, fmt.Sprintf("%s[%s]: printed by nftlb, not by xlb", path, name))
						continue
					}
					walk(fmt.Sprintf("%s[%s]", path, name), nm[name], xm[name])
				}
				return
			}
			for i := range nv {
				walk(fmt.Sprintf("%s[%d]", path, i), nv[i], xv[i])
			}
		default:
			if n != x {
				diffs = append(diffs, fmt.Sprintf("%s: nftlb %v, xlb %v", path, n, x))
			}
		}
	}
	walk("", n, x)
	return diffs, seen
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// The comparison itself finds differences: a test that cannot fail proves
// nothing.
func TestCompareJSONFindsDifferences(t *testing.T) {
	n := `{"farms":[{"name":"a","mode":"snat","sched-param":"srcip srcport ","backends":[{"name":"b","mark":"0x1","weight":"1"}]}]}`
	for x, want := range map[string]int{
		`{"farms":[{"name":"a","mode":"snat","sched-param":"srcip srcport","backends":[{"name":"b","mark":"0x0","weight":"1"}]}]}`:  0,
		`{"farms":[{"name":"a","mode":"dnat","sched-param":"srcip srcport","backends":[{"name":"b","mark":"0x0","weight":"1"}]}]}`:  1,
		`{"farms":[{"name":"a","mode":"snat","sched-param":"srcip srcport","backends":[{"name":"b","mark":"0x0","weight":"2"}]}]}`:  1,
		`{"farms":[{"name":"a","mode":"snat","sched-param":"srcip srcport","backends":[]}]}`:                                        1,
		`{"farms":[{"name":"a","sched-param":"srcip srcport","colour":"red","backends":[{"name":"b","mark":"0x0","weight":"1"}]}]}`: 2,
	} {
		if d, _ := compareJSON(n, x); len(d) != want {
			t.Errorf("%s: %d differences %v, want %d", x, len(d), d, want)
		}
	}
}
