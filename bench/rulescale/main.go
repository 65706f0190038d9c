// Command rulescale counts the kernel objects the nft data plane creates per
// farm and per backend (kube-nftlb's "rules by count type"): it starts the
// real xlb daemon, adds farms of 1, 10 and 100 backends through the API and
// counts rules, chains, sets, maps and their elements in
// `nft -j list ruleset` (xlb's tables: the namespace holds nothing else)
// before and after each farm. The nft plane spreads farms over tables
// (--nft-tables, default 32), so a farm's numbers include what the first farm
// of a table adds to it; the second farm shows the marginal cost.
//
// Each farm is added twice and both differences are reported: the second
// farm shows the marginal cost once shared objects exist (they match when
// nothing is shared).
//
// It must run inside a network namespace of its own (bench/run.sh does that)
// and refuses to run in the host's, whose nftables it would change.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/xlb-lb/xlb/bench/internal/apicall"
	"github.com/xlb-lb/xlb/bench/internal/results"
)

const (
	apiAddr = "127.0.0.1:5592"
	apiKey  = "bench-key-not-secret"
)

// config is one kind of farm measured.
type config struct{ Mode, Sched string }

type row struct {
	Config   config         `json:"config"`
	Backends int            `json:"backends"`
	PerFarm  map[string]int `json:"per_farm"`         // first farm of this size
	Second   map[string]int `json:"second_farm"`      // another farm of the same size
	Table    map[string]int `json:"table_after_both"` // the whole table afterwards
}

type report struct {
	Date  string         `json:"date"`
	Base  map[string]int `json:"empty_table"`
	Rows  []row          `json:"results"`
	Notes []string       `json:"notes"`
}

func main() {
	xlb := flag.String("xlb", "bin/xlb", "xlb binary")
	out := flag.String("out", "bench/results", "results directory")
	sizes := flag.String("backends", "1,10,100", "backends per farm, comma separated")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("rulescale: ")
	if err := run(*xlb, *out, *sizes); err != nil {
		log.Fatal(err)
	}
}

func run(xlb, out, sizes string) error {
	// `ip netns identify` names the namespace of this process if it is one
	// created with `ip netns add`; the host's namespace has no name.
	name, err := exec.Command("ip", "netns", "identify", fmt.Sprint(os.Getpid())).Output()
	if err != nil || len(bytes.TrimSpace(name)) == 0 {
		return fmt.Errorf("run in a network namespace of its own (ip netns exec; bench/run.sh does): it programs this namespace's nftables")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	state, err := os.MkdirTemp("", "xlb-rulescale-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(state)
	daemon := exec.CommandContext(ctx, xlb, "daemon", "--listen", apiAddr, "--state-dir", state, "--log-level", "error")
	daemon.Env = append(os.Environ(), "XLB_KEY="+apiKey)
	daemon.Stderr = os.Stderr
	if err := daemon.Start(); err != nil {
		return fmt.Errorf("start daemon: %w", err)
	}
	defer func() { daemon.Process.Kill(); daemon.Wait() }()
	if err := waitReady(ctx); err != nil {
		return err
	}

	rep := report{Date: time.Now().UTC().Format(time.RFC3339)}
	configs := []config{{"snat", "rr"}, {"dnat", "hash"}, {"snat", "weight"}}
	var ns []int
	for _, f := range strings.Split(sizes, ",") {
		var n int
		if _, err := fmt.Sscan(f, &n); err != nil || n < 1 {
			return fmt.Errorf("-backends: %q is not a positive number", f)
		}
		ns = append(ns, n)
	}
	for _, c := range configs {
		for _, n := range ns {
			if err := call(ctx, "PUT", "/state", []byte(`{"farms":[]}`)); err != nil {
				return err
			}
			base, err := count(ctx)
			if err != nil {
				return err
			}
			if rep.Base == nil {
				rep.Base = base
			}
			r := row{Config: c, Backends: n}
			prev := base
			for i := range 2 {
				if err := call(ctx, "POST", "/farms", farm(i, n, c)); err != nil {
					return err
				}
				now, err := count(ctx)
				if err != nil {
					return err
				}
				if i == 0 {
					r.PerFarm = diff(now, prev)
				} else {
					r.Second = diff(now, prev)
					r.Table = now
				}
				prev = now
			}
			rep.Rows = append(rep.Rows, r)
			log.Printf("%s/%s x%d backends: %v", c.Mode, c.Sched, n, r.PerFarm)
		}
	}
	rep.Notes = append(rep.Notes,
		"Counted from `nft -j list ruleset` in a namespace holding only xlb's tables: every table, rule, chain, set and map object, and the elements of sets and maps (\"set elements\", \"map elements\"); a farm's numbers are the difference to the ruleset before it was added. The daemon runs with its default --nft-tables, so farms land in different tables.",
		"Farms: one VIP, TCP port 80, backends with weight 1 (scheduler weight: weights 1..n cycling 1-5).",
	)
	return results.Write(out, "rule-scale", rep, markdown(rep))
}

var kinds = []string{"table", "rule", "chain", "map", "set", "map elements", "set elements"}

func markdown(rep report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Rule scale: kernel objects per farm (nft data plane)\n\nMeasured %s. Empty state (no farms): %s.\n\n", rep.Date, format(rep.Base))
	b.WriteString("| mode / scheduler | backends | tables | rules | chains | maps | sets | map elements | set elements | 2nd farm of the same size | per backend (from the previous size) |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	var prev *row
	for i := range rep.Rows {
		r := &rep.Rows[i]
		fmt.Fprintf(&b, "| %s / %s | %d |", r.Config.Mode, r.Config.Sched, r.Backends)
		for _, k := range kinds {
			fmt.Fprintf(&b, " %d |", r.PerFarm[k])
		}
		second := "same"
		if !equal(r.PerFarm, r.Second) {
			second = format(r.Second)
		}
		per := ""
		if prev != nil && prev.Config == r.Config && r.Backends > prev.Backends {
			var parts []string
			for _, k := range kinds {
				if d := float64(r.PerFarm[k]-prev.PerFarm[k]) / float64(r.Backends-prev.Backends); d != 0 {
					parts = append(parts, fmt.Sprintf("%s %.2f", k, d))
				}
			}
			per = strings.Join(parts, ", ")
			if per == "" {
				per = "none"
			}
		}
		fmt.Fprintf(&b, " %s | %s |\n", second, per)
		prev = r
	}
	b.WriteString("\n")
	for _, n := range rep.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	return b.String()
}

func format(m map[string]int) string {
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	for k, v := range m {
		if !slices.Contains(kinds, k) {
			parts = append(parts, fmt.Sprintf("%s %d", k, v))
		}
	}
	return strings.Join(parts, ", ")
}

func equal(a, b map[string]int) bool {
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	for k, v := range b {
		if a[k] != v {
			return false
		}
	}
	return true
}

func diff(now, before map[string]int) map[string]int {
	d := map[string]int{}
	for k, v := range now {
		d[k] = v - before[k]
	}
	for k, v := range before {
		if _, ok := now[k]; !ok {
			d[k] = -v
		}
	}
	return d
}

// count returns the objects of the namespace's ruleset (xlb's tables) by
// kind.
func count(ctx context.Context) (map[string]int, error) {
	out, err := exec.CommandContext(ctx, "nft", "-j", "list", "ruleset").Output()
	if err != nil {
		return nil, fmt.Errorf("nft -j list ruleset: %w", err)
	}
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, fmt.Errorf("parse nft -j output: %w", err)
	}
	c := map[string]int{}
	for _, obj := range doc.Nftables {
		for kind, body := range obj {
			if kind == "metainfo" {
				continue
			}
			c[kind]++
			if kind == "set" || kind == "map" {
				var s struct {
					Elem []json.RawMessage `json:"elem"`
				}
				if err := json.Unmarshal(body, &s); err != nil {
					return nil, fmt.Errorf("parse %s: %w", kind, err)
				}
				c[kind+" elements"] += len(s.Elem)
			}
		}
	}
	for _, k := range kinds {
		c[k] += 0 // present even when zero, for the table
	}
	return c, nil
}

// farm is the POST /farms body of farm i with n backends.
func farm(i, n int, c config) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"farms":[{"name":"rs%d","virtual-addr":"10.99.%d.1","virtual-ports":"80","mode":%q,"scheduler":%q,"backends":[`, i, i, c.Mode, c.Sched)
	for j := range n {
		if j > 0 {
			b.WriteByte(',')
		}
		w := 1
		if c.Sched == "weight" {
			w = j%5 + 1
		}
		fmt.Fprintf(&b, `{"name":"b%d","ip-addr":"10.%d.%d.%d","port":"8080","weight":"%d"}`, j, 200+i, j/250, j%250+1, w)
	}
	b.WriteString("]}]}")
	return b.Bytes()
}

var client = &http.Client{Timeout: time.Minute}

func call(ctx context.Context, method, path string, body []byte) error {
	return apicall.Client{HTTP: client, Base: "http://" + apiAddr, Key: apiKey}.Call(ctx, method, path, body)
}

func waitReady(ctx context.Context) error {
	return apicall.Client{HTTP: client, Base: "http://" + apiAddr, Key: apiKey}.WaitReady(ctx)
}
