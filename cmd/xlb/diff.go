package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/xlb-lb/xlb/internal/client"
)

func (a *app) diffCmd() *cobra.Command {
	var otherKey, otherKeyFile string
	cmd := &cobra.Command{
		Use:   "diff OTHER-API [--other-key KEY | --other-key-file FILE]",
		Short: "Compare this daemon's state with another node's",
		Long: `Compare the whole state (GET /state) of the daemon at --api with that of the
daemon at OTHER-API (http://HOST:PORT or unix:PATH), farm by farm: a farm
only on one side, or a field (a backend's, a check's) that differs, one line
each; then the tables, their definitions field by field and their entries
by key (not their expiry times). Exits 0 when both hold the same farms and
tables, 1 when they differ.

Outside Kubernetes, every node of a cluster takes the same state from the
operator's tooling (xlb restore, or PUT /state, on each node); this is the
check that they did. The other node's key is --other-key or --other-key-file
(default: this node's key).`,
		Example: `  xlb diff http://10.101.0.12:5555
  xlb --api http://10.101.0.11:5555 diff http://10.101.0.12:5555 --other-key-file /etc/xlb/lb2.key`,
		Args: args("OTHER-API"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			here, err := a.client(cmd)
			if err != nil {
				return err
			}
			key := otherKey
			if otherKeyFile != "" {
				if otherKey != "" {
					return fmt.Errorf("--other-key and --other-key-file: give one of them")
				}
				if key, err = readKeyFile(otherKeyFile); err != nil {
					return err
				}
			}
			if key == "" {
				key, _ = a.clientKey(cmd)
			}
			base := argv[0]
			if !strings.Contains(base, "://") && !strings.HasPrefix(base, "unix:") {
				base = "http://" + base
			}
			there := client.New(base, key, a.httpClient)
			var mine, theirs bytes.Buffer
			if _, err := here.Dump(cmd.Context(), &mine); err != nil {
				return fmt.Errorf("state of %s: %w", here.Where(), err)
			}
			if _, err := there.Dump(cmd.Context(), &theirs); err != nil {
				return fmt.Errorf("state of %s: %w", there.Where(), err)
			}
			lines, err := diffStates(mine.Bytes(), theirs.Bytes())
			if err != nil {
				return err
			}
			for _, l := range lines {
				fmt.Fprintln(a.out, l)
			}
			if len(lines) > 0 {
				return fmt.Errorf("%s and %s differ: %d difference(s)", here.Where(), there.Where(), len(lines))
			}
			fmt.Fprintf(a.out, "same state: %s and %s\n", here.Where(), there.Where())
			return nil
		},
	}
	cmd.Flags().StringVar(&otherKey, "other-key", "", "API key of the other node (default: this node's)")
	cmd.Flags().StringVar(&otherKeyFile, "other-key-file", "", "file holding the other node's API key")
	return cmd
}

// diffStates compares two GET /state documents: farms by name, field by
// field (a farm's and a backend's check field by field, backends by name),
// and tables by name, their definitions field by field and their entries
// by key ("<" is the first, this node; ">" the second). An entry's expiry
// time is not compared: each node counts it from when it took the entry.
func diffStates(a, b []byte) ([]string, error) {
	sa, err := objectsByName(a)
	if err != nil {
		return nil, fmt.Errorf("this node's state: %w", err)
	}
	sb, err := objectsByName(b)
	if err != nil {
		return nil, fmt.Errorf("other node's state: %w", err)
	}
	out := diffNamed("", "farm", sa.Farms, sb.Farms)
	return append(out, diffNamed("", "table", sa.Tables, sb.Tables)...), nil
}

// stateObjects is a GET /state document's farms and tables.
type stateObjects struct {
	Farms  []any `json:"farms"`
	Tables []any `json:"tables"`
}

func objectsByName(doc []byte) (stateObjects, error) {
	var st stateObjects
	if err := json.Unmarshal(doc, &st); err != nil {
		return st, fmt.Errorf("decode: %w", err)
	}
	return st, nil
}

// keyOf is the member that names the objects of a list: backends, farms
// and tables by "name", a table's entries by "key".
func keyOf(kind string) string {
	if kind == "entry" {
		return "key"
	}
	return "name"
}

// diffNamed compares two lists of objects of one kind matched by their
// key; what is the object holding the lists ("" at the top).
func diffNamed(what, kind string, x, y any) []string {
	byKey := func(v any) map[string]map[string]any {
		m := map[string]map[string]any{}
		list, _ := v.([]any)
		for _, b := range list {
			if o, ok := b.(map[string]any); ok {
				n, _ := o[keyOf(kind)].(string)
				m[n] = o
			}
		}
		return m
	}
	bx, by := byKey(x), byKey(y)
	names := slices.Sorted(maps.Keys(bx))
	for n := range by {
		if _, ok := bx[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	prefix, inner := "", fmt.Sprintf("%s ", kind)
	if what != "" {
		prefix, inner = what+": ", what+" "+kind+" "
	}
	var out []string
	for _, n := range names {
		p, inX := bx[n]
		q, inY := by[n]
		switch {
		case !inY:
			out = append(out, fmt.Sprintf("< %s%s %q only here", prefix, kind, n))
		case !inX:
			out = append(out, fmt.Sprintf("> %s%s %q only there", prefix, kind, n))
		default:
			out = append(out, diffObjects(fmt.Sprintf("%s%q", inner, n), p, q)...)
		}
	}
	return out
}

// diffObjects compares two objects' members: lists of backends and
// entries by their keys, objects (checks) member by member, the rest as
// JSON text.
func diffObjects(what string, x, y map[string]any) []string {
	var out []string
	keys := slices.Sorted(maps.Keys(x))
	for k := range y {
		if _, ok := x[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range slices.Compact(keys) {
		switch k {
		case "backends":
			out = append(out, diffNamed(what, "backend", x[k], y[k])...)
			continue
		case "entries":
			out = append(out, diffNamed(what, "entry", x[k], y[k])...)
			continue
		case "expires":
			continue
		}
		ox, okx := x[k].(map[string]any)
		oy, oky := y[k].(map[string]any)
		if okx && oky && k == "check" {
			out = append(out, diffObjects(what+" "+k, ox, oy)...)
			continue
		}
		vx, vy := jsonText(x[k]), jsonText(y[k])
		if vx != vy {
			out = append(out, fmt.Sprintf("! %s: %s: %s here, %s there", what, k, vx, vy))
		}
	}
	return out
}

func jsonText(v any) string {
	if v == nil {
		return "(absent)"
	}
	b, _ := json.Marshal(v)
	return string(b)
}
