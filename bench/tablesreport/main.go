// Command tablesreport summarizes bench/tables.sh's raw output (Go
// benchmark lines of BenchmarkTablesLBCPU and BenchmarkTablesEBPF, one per
// round) as markdown: per metric and list size the median over rounds, the
// min - max, and for the ratios of the target Welch's 95 % confidence
// interval of the difference between two systems' LB cost per packet
// (bench/internal/stats). It also writes tables.json for bench/charts.
// With -ab it summarizes bench/tables-ab.sh's output instead: each metric
// of the new build against the old.
//
//	go run ./bench/tablesreport -dir bench/results
//	go run ./bench/tablesreport -ab -dir bench/results
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/xlb-lb/xlb/bench/internal/stats"
)

// samples[benchmark][metric] are the rounds' values.
type samples map[string]map[string][]float64

var reName = regexp.MustCompile(`^(Benchmark\S+?)(-\d+)?$`)

func read(path string) (samples, []string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	out := samples{}
	var order []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 4 {
			continue
		}
		m := reName.FindStringSubmatch(fs[0])
		if m == nil {
			continue
		}
		name := m[1]
		if out[name] == nil {
			out[name] = map[string][]float64{}
			order = append(order, name)
		}
		for i := 2; i+1 < len(fs); i += 2 {
			v, err := strconv.ParseFloat(fs[i], 64)
			if err != nil {
				continue
			}
			out[name][fs[i+1]] = append(out[name][fs[i+1]], v)
		}
	}
	return out, order, sc.Err()
}

func span(v []float64) string {
	s := stats.Summarize(v)
	return fmt.Sprintf("%.4g (%.4g - %.4g), %d", s.Median, s.Min, s.Max, s.N)
}

func main() {
	dir := flag.String("dir", "bench/results", "directory of tables-lbcpu.txt and tables-ebpf-bench.txt")
	ab := flag.Bool("ab", false, "summarize tables-ab-old.txt against tables-ab-new.txt (bench/tables-ab.sh)")
	flag.Parse()
	if *ab {
		abReport(*dir)
		return
	}
	lb, order, err := read(filepath.Join(*dir, "tables-lbcpu.txt"))
	if err != nil {
		log.Fatal(err)
	}
	chart := map[string]map[string]stats.Summary{}
	fmt.Println("### Packets through the LB with a deny list (BenchmarkTablesLBCPU)")
	fmt.Println()
	fmt.Println("LB ns/pkt: median over rounds (min - max), rounds. Rate ratios: the packet rate with the list over the rate without (LB ns without / LB ns with), the median over a round's chunks, then over rounds.")
	for _, b := range order {
		m := lb[b]
		fmt.Printf("\n**%s**\n\n| metric | median (min - max), rounds |\n|---|---|\n", strings.TrimPrefix(b, "BenchmarkTablesLBCPU/"))
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		chart[b] = map[string]stats.Summary{}
		for _, k := range keys {
			if k == "ns/op" {
				continue
			}
			fmt.Printf("| %s | %s |\n", k, span(m[k]))
			chart[b][k] = stats.Summarize(m[k])
		}
		fmt.Println()
		for _, pair := range [][2]string{{"ebpf-list", "ebpf-0"}, {"ebpf-0b", "ebpf-0"}, {"stls-list", "stls-0"}, {"nft-list", "nft-0"},
			{"nft-set", "ebpf-list"}, {"nft-set", "nft-0"}, {"ebpf-drop", "nft-set-drop"}, {"xdp-drop", "nft-set-drop"}, {"xdp-drop", "ebpf-drop"}} {
			unit := "-lb-ns/pkt"
			if strings.HasSuffix(pair[0], "drop") {
				unit = "-cpu-ns/pkt"
			}
			d, ok := stats.Compare(m[pair[0]+unit], m[pair[1]+unit])
			if !ok {
				continue
			}
			sig := "not significant"
			if d.Significant {
				sig = "significant"
			}
			fmt.Printf("- %s%s against %s: %+.1f %% ± %.1f %% (95 %%, Welch; %s)\n", pair[0], unit, pair[1], d.Percent, d.PlusMinus, sig)
		}
	}
	ops, oorder, err := read(filepath.Join(*dir, "tables-ebpf-bench.txt"))
	if err == nil {
		fmt.Println("\n### eBPF table operations (BenchmarkTablesEBPF, ApplyTables)")
		fmt.Println()
		fmt.Println("| operation | median (min - max), rounds |\n|---|---|")
		for _, b := range oorder {
			v := ops[b]["ns/op"]
			s := stats.Summarize(v)
			fmt.Printf("| %s | %s µs (%s - %s), %d |\n", strings.TrimPrefix(b, "BenchmarkTablesEBPF/"),
				us(s.Median), us(s.Min), us(s.Max), s.N)
		}
	}
	buf, err := json.MarshalIndent(chart, "", " ")
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(*dir, "tables.json"), buf, 0o644); err != nil {
		log.Fatal(err)
	}
}

func us(ns float64) string { return strconv.FormatFloat(ns/1000, 'g', 4, 64) }

// abReport prints, for each benchmark and metric of bench/tables-ab.sh,
// the old and new builds' medians and the difference at 95 % confidence.
func abReport(dir string) {
	old, order, err := read(filepath.Join(dir, "tables-ab-old.txt"))
	if err != nil {
		log.Fatal(err)
	}
	nw, _, err := read(filepath.Join(dir, "tables-ab-new.txt"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("| benchmark | metric | old: median (min - max), rounds | new: median (min - max), rounds | new against old (95 %, Welch) |")
	fmt.Println("|---|---|---|---|---|")
	for _, b := range order {
		keys := make([]string, 0, len(old[b]))
		for k := range old[b] {
			if k == "ns/op" || k == "%path" || strings.Contains(k, "cpu-ns") || strings.HasPrefix(k, "nft") ||
				strings.HasPrefix(k, "local") || strings.Contains(k, "drop") {
				continue
			}
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			o, n := old[b][k], nw[b][k]
			if len(n) == 0 {
				continue
			}
			cmp := "n/a"
			if d, ok := stats.Compare(n, o); ok {
				sig := "not significant"
				if d.Significant {
					sig = "significant"
				}
				cmp = fmt.Sprintf("%+.1f %% ± %.1f %% (%s)", d.Percent, d.PlusMinus, sig)
			}
			fmt.Printf("| %s | %s | %s | %s | %s |\n", strings.TrimPrefix(b, "Benchmark"), k, span(o), span(n), cmp)
		}
	}
}
