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
only on one side, or a field (or a backend's field) that differs, one line
each. Exits 0 when both hold the same farms, 1 when they differ.

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

// diffStates compares two GET /state documents farm by farm and field by
// field; "<" is the first (this node), ">" the second.
func diffStates(a, b []byte) ([]string, error) {
	fa, err := farmsByName(a)
	if err != nil {
		return nil, fmt.Errorf("this node's state: %w", err)
	}
	fb, err := farmsByName(b)
	if err != nil {
		return nil, fmt.Errorf("other node's state: %w", err)
	}
	var out []string
	names := slices.Sorted(maps.Keys(fa))
	for n := range fb {
		if _, ok := fa[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		x, inA := fa[n]
		y, inB := fb[n]
		switch {
		case !inB:
			out = append(out, fmt.Sprintf("< farm %q only here", n))
		case !inA:
			out = append(out, fmt.Sprintf("> farm %q only there", n))
		default:
			out = append(out, diffObjects(fmt.Sprintf("farm %q", n), x, y)...)
		}
	}
	return out, nil
}

func farmsByName(doc []byte) (map[string]map[string]any, error) {
	var st struct {
		Farms []map[string]any `json:"farms"`
	}
	if err := json.Unmarshal(doc, &st); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	out := map[string]map[string]any{}
	for _, f := range st.Farms {
		n, _ := f["name"].(string)
		out[n] = f
	}
	return out, nil
}

// diffObjects compares two farms' JSON objects; backends are matched by
// name.
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
		if k == "backends" {
			out = append(out, diffBackends(what, x[k], y[k])...)
			continue
		}
		vx, vy := jsonText(x[k]), jsonText(y[k])
		if vx != vy {
			out = append(out, fmt.Sprintf("! %s: %s: %s here, %s there", what, k, vx, vy))
		}
	}
	return out
}

func diffBackends(what string, x, y any) []string {
	byName := func(v any) map[string]map[string]any {
		m := map[string]map[string]any{}
		list, _ := v.([]any)
		for _, b := range list {
			if o, ok := b.(map[string]any); ok {
				n, _ := o["name"].(string)
				m[n] = o
			}
		}
		return m
	}
	bx, by := byName(x), byName(y)
	var out []string
	names := slices.Sorted(maps.Keys(bx))
	for n := range by {
		if _, ok := bx[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		p, inX := bx[n]
		q, inY := by[n]
		switch {
		case !inY:
			out = append(out, fmt.Sprintf("< %s: backend %q only here", what, n))
		case !inX:
			out = append(out, fmt.Sprintf("> %s: backend %q only there", what, n))
		default:
			out = append(out, diffObjects(fmt.Sprintf("%s backend %q", what, n), p, q)...)
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
