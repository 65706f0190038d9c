// Command charts draws the benchmark results as PNG charts with gnuplot
// (Debian's gnuplot-nox), from the JSON the benchmarks wrote, so a chart can
// be redrawn without measuring again:
//
//   - datapath.json -> datapath.png: req/s and p99 latency (udp: packets/s
//     and softirq per packet) per system, bars at the median with min/max whiskers, a row
//     of panels per load;
//   - control-plane.json -> control-plane.png: a boxplot of every
//     measurement's samples next to its baseline (log scale);
//   - rule-scale.json -> rule-scale.png: kernel objects per farm by farm size;
//   - converge.json -> converge.png: boxplots of the time until traffic
//     follows a farm's add and delete, by backends and farms present, xlb
//     next to nft -f (the kube-nftlb charts);
//   - conntable.json -> conntable.png: CPU per packet and packets/s relative
//     to the plain-forwarding reference, by tracked connections (log scale),
//     a line per data plane and table size, a column per load.
//   - tables.json -> tables.png: the LB's CPU per packet with a deny list of
//     1k, 100k and 1M CIDRs, each plane with and without the list and a
//     plain nftables set (bars at the median over rounds), from
//     bench/tablesreport;
//   - kube-create-delete.json -> kube-create-delete.png: boxplots of the time
//     from a Service's create (delete) call until traffic reaches (no longer
//     reaches) its endpoints, by endpoint count, xlb nft, xlb ebpf, kube-proxy
//     nftables and iptables side by side.
//
// A missing JSON file is reported and skipped (each benchmark can run alone);
// a gnuplot failure is an error.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

func main() {
	dir := flag.String("dir", "bench/results", "directory of the JSON results; the PNGs are written there")
	only := flag.String("only", "", "draw only the chart of this JSON file (e.g. kube-create-delete.json)")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("charts: ")
	if _, err := exec.LookPath("gnuplot"); err != nil {
		log.Fatal("gnuplot not found (scripts/install-deps.sh installs gnuplot-nox)")
	}
	tmp, err := os.MkdirTemp("", "xlb-charts-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	drawn := 0
	for _, c := range []struct {
		json string
		draw func(dir, tmp string, raw []byte) error
	}{
		{"datapath.json", datapath},
		{"control-plane.json", controlPlane},
		{"rule-scale.json", ruleScale},
		{"converge.json", converge},
		{"conntable.json", conntable},
		{"kube-create-delete.json", kubeCreateDelete},
		{"tables.json", tablesChart},
	} {
		if *only != "" && c.json != *only {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(*dir, c.json))
		if err != nil {
			log.Printf("skip %s: %v", c.json, err)
			continue
		}
		if err := c.draw(*dir, tmp, raw); err != nil {
			log.Fatalf("chart of %s: %v", c.json, err)
		}
		drawn++
	}
	if drawn == 0 {
		log.Fatalf("no results in %s to draw", *dir)
	}
}

// gnuplot runs script, with data files already written to tmp.
func gnuplot(tmp, script string) error {
	f := filepath.Join(tmp, "chart.gp")
	if err := os.WriteFile(f, []byte(script), 0o644); err != nil {
		return err
	}
	cmd := exec.Command("gnuplot", f)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("gnuplot: %w: %s", err, out)
	}
	return nil
}

const header = `set terminal pngcairo size %d,%d font "sans,10"
set output %q
set grid ytics
set border 3
set tics nomirror
set key off
`

type summary struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func datapath(dir, tmp string, raw []byte) error {
	var rep struct {
		Date    string `json:"date"`
		Machine string `json:"machine"`
		Rows    []struct {
			System  string  `json:"system"`
			Load    string  `json:"load"`
			ReqPS   summary `json:"req_per_sec"`
			P99     summary `json:"p99_ms"`
			Softirq summary `json:"softirq_us_per_req"`
		} `json:"results"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		return err
	}
	var loads []string
	for _, r := range rep.Rows {
		if !slices.Contains(loads, r.Load) {
			loads = append(loads, r.Load)
		}
	}
	out := filepath.Join(dir, "datapath.png")
	abs, _ := filepath.Abs(out)
	var s strings.Builder
	fmt.Fprintf(&s, header, 1200, 420*len(loads), abs)
	fmt.Fprintf(&s, "set multiplot layout %d,2 title %q\n", len(loads), "Data path, client -> VIP -> 3 backends (bars: median, whiskers: min-max) - "+rep.Machine)
	s.WriteString("set style data histogram\nset style histogram errorbars gap 1 lw 1\nset style fill solid 0.6 border -1\nset boxwidth 0.8\nset yrange [0:*]\nset xtics rotate by -25\n")
	for i, load := range loads {
		data := fmt.Sprintf("dp-%d.dat", i)
		var d strings.Builder
		for _, r := range rep.Rows {
			if r.Load == load {
				second := r.P99
				if load == "udp" {
					second = r.Softirq
				}
				fmt.Fprintf(&d, "%q %g %g %g %g %g %g\n", r.System, r.ReqPS.Median, r.ReqPS.Min, r.ReqPS.Max, second.Median, second.Min, second.Max)
			}
		}
		if err := os.WriteFile(filepath.Join(tmp, data), []byte(d.String()), 0o644); err != nil {
			return err
		}
		if load == "udp" {
			fmt.Fprintf(&s, "set title %q\nset ylabel \"packets/s\"\nplot %q using 2:3:4:xtic(1) lc rgb \"#4878a8\"\n", "udp: packets per second reaching the backends (higher is better)", data)
			fmt.Fprintf(&s, "set title %q\nset ylabel \"µs\"\nplot %q using 5:6:7:xtic(1) lc rgb \"#c0504d\"\n", "udp: softirq time per packet, whole machine (lower is better)", data)
			continue
		}
		fmt.Fprintf(&s, "set title %q\nset ylabel \"requests/s\"\nplot %q using 2:3:4:xtic(1) lc rgb \"#4878a8\"\n", load+": HTTP requests per second (higher is better)", data)
		fmt.Fprintf(&s, "set title %q\nset ylabel \"ms\"\nplot %q using 5:6:7:xtic(1) lc rgb \"#c0504d\"\n", load+": p99 latency (lower is better)", data)
	}
	s.WriteString("unset multiplot\n")
	if err := gnuplot(tmp, s.String()); err != nil {
		return err
	}
	log.Printf("wrote %s", out)
	return nil
}

// shortLabel turns control-plane measurement names into axis labels.
func shortLabel(name string) string {
	for _, m := range []struct {
		re  *regexp.Regexp
		fmt string
	}{
		{regexp.MustCompile(`^API add farm x (\d+) backends, (\d+) farms of (\d+) backends.*$`), "xlb add x${1}\\n@${2}x${3}"},
		{regexp.MustCompile(`^nft -f: one farm x (\d+) backends \((\d+) farms of (\d+) backends.*$`), "nft -f x${1}\\n@${2}x${3}"},
		{regexp.MustCompile(`^API add farm x (\d+) backends, (\d+) farms.*$`), "xlb add x${1}\\n@${2} farms"},
		{regexp.MustCompile(`^nft -f: one farm x (\d+) backends \((\d+) farms.*$`), "nft -f x${1}\\n@${2} farms"},
		{regexp.MustCompile(`^API bulk POST (\d+) farms x (\d+).*$`), "xlb bulk\\n${1}x${2}"},
		{regexp.MustCompile(`^nft -f: (\d+) farms x (\d+).*$`), "nft -f\\n${1}x${2}"},
		{regexp.MustCompile(`^xlb (dump|list -n) over the Unix socket, (\d+) VIP \+ (\d+) fwmark farms x (\d+) backends.*$`), "xlb ${1} (sock)\\n${2}+${3}fw x${4}"},
		{regexp.MustCompile(`^xlb (dump|list -n) over the Unix socket, (\d+) farms x (\d+) backends.*$`), "xlb ${1} (sock)\\n${2}x${3}"},
		{regexp.MustCompile(`^xlb (dump|list -n|save -f|restore -f), (\d+) VIP \+ (\d+) fwmark farms x (\d+) backends.*$`), "xlb ${1}\\n${2}+${3}fw x${4}"},
		{regexp.MustCompile(`^nft list ruleset \((\d+) VIP \+ (\d+) fwmark farms x (\d+) backends.*$`), "nft list\\n${1}+${2}fw x${3}"},
		{regexp.MustCompile(`^nft -f \(restore baseline\): (\d+) VIP \+ (\d+) fwmark farms x (\d+) backends.*$`), "nft -f\\n${1}+${2}fw x${3}"},
		{regexp.MustCompile(`^xlb (dump|list -n|save -f|restore -f), (\d+) farms x (\d+) backends.*$`), "xlb ${1}\\n${2}x${3}"},
		{regexp.MustCompile(`^xlb (dump|list -n), (\d+) farms.*$`), "xlb ${1}\\n${2} farms"},
		{regexp.MustCompile(`^nft list (?:table inet xlb|ruleset) \((\d+) farms x (\d+) backends.*$`), "nft list\\n${1}x${2}"},
		{regexp.MustCompile(`^nft list (?:table inet xlb|ruleset) \((\d+) farms.*$`), "nft list\\n${1} farms"},
		{regexp.MustCompile(`^nft -f \(restore baseline\): (\d+) farms x (\d+) backends.*$`), "nft -f\\n${1}x${2}"},
	} {
		if m.re.MatchString(name) {
			return m.re.ReplaceAllString(name, m.fmt)
		}
	}
	if len(name) > 24 {
		name = name[:24]
	}
	return name
}

type cpResult struct {
	Name     string    `json:"name"`
	Samples  []float64 `json:"samples"`
	Baseline string    `json:"baseline"`
}

// controlPlane draws two charts: single changes (control-plane.png) and the
// whole-process bulk matrix (control-plane-bulk.png).
func controlPlane(dir, tmp string, raw []byte) error {
	var rs []cpResult
	if err := json.Unmarshal(raw, &rs); err != nil {
		return err
	}
	var single, bulk []cpResult
	for _, r := range rs {
		if strings.Contains(r.Name, "(whole process") || strings.HasPrefix(r.Name, "nft list ") || strings.HasPrefix(r.Name, "nft -f (restore baseline)") {
			bulk = append(bulk, r)
		} else {
			single = append(single, r)
		}
	}
	if err := boxplots(dir, tmp, "control-plane.png", "Control plane: xlb API calls (blue) and the nft -f baseline in the same run (red)", single); err != nil {
		return err
	}
	if len(bulk) == 0 {
		return nil
	}
	return boxplots(dir, tmp, "control-plane-bulk.png", "Bulk, whole processes (hyperfine), farms x backends: xlb (blue) and nft (red) in the same run", bulk)
}

func boxplots(dir, tmp, name, title string, rs []cpResult) error {
	var d strings.Builder
	var plots, tics []string
	for i, r := range rs {
		if i > 0 {
			d.WriteString("\n\n") // gnuplot data blocks, addressed with "index"
		}
		for _, v := range r.Samples {
			fmt.Fprintf(&d, "%g\n", v)
		}
		color := "#c0504d" // baseline
		if r.Baseline != "" {
			color = "#4878a8" // xlb, measured against the baseline that follows it
		}
		plots = append(plots, fmt.Sprintf("'cp.dat' index %d using (%d):1 with boxplot lc rgb %q", i, i+1, color))
		tics = append(tics, fmt.Sprintf("\"%s\" %d", shortLabel(r.Name), i+1))
	}
	if err := os.WriteFile(filepath.Join(tmp, "cp.dat"), []byte(d.String()), 0o644); err != nil {
		return err
	}
	out := filepath.Join(dir, name)
	abs, _ := filepath.Abs(out)
	var s strings.Builder
	fmt.Fprintf(&s, header, max(900, 80*len(rs)), 520, abs)
	fmt.Fprintf(&s, "set title %q\n", title+"\nboxes p25-p75, whiskers 1.5 IQR (fewer than 4 samples: points)")
	s.WriteString("set termoption noenhanced\nset ylabel \"ms (log scale)\"\nset logscale y\nset style fill solid 0.5 border -1\nset style boxplot outliers pointtype 7\nset pointsize 0.4\nset boxwidth 0.5 absolute\n")
	fmt.Fprintf(&s, "set xrange [0.3:%g]\nset xtics (%s) font \",8\"\n", float64(len(rs))+0.7, strings.Join(tics, ", "))
	s.WriteString("plot " + strings.Join(plots, ", \\\n  ") + "\n")
	if err := gnuplot(tmp, s.String()); err != nil {
		return err
	}
	log.Printf("wrote %s", out)
	return nil
}

func ruleScale(dir, tmp string, raw []byte) error {
	var rep struct {
		Rows []struct {
			Config   struct{ Mode, Sched string } `json:"config"`
			Backends int                          `json:"backends"`
			PerFarm  map[string]int               `json:"per_farm"`
		} `json:"results"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		return err
	}
	var kinds []string
	for _, r := range rep.Rows {
		for k := range r.PerFarm {
			if !slices.Contains(kinds, k) {
				kinds = append(kinds, k)
			}
		}
	}
	slices.Sort(kinds)
	var d strings.Builder
	d.WriteString("backends")
	for _, k := range kinds {
		fmt.Fprintf(&d, " %q", k)
	}
	d.WriteString("\n")
	for _, r := range rep.Rows {
		fmt.Fprintf(&d, "\"%s %s\\n%d\"", r.Config.Mode, r.Config.Sched, r.Backends)
		for _, k := range kinds {
			fmt.Fprintf(&d, " %d", r.PerFarm[k])
		}
		d.WriteString("\n")
	}
	if err := os.WriteFile(filepath.Join(tmp, "rs.dat"), []byte(d.String()), 0o644); err != nil {
		return err
	}
	out := filepath.Join(dir, "rule-scale.png")
	abs, _ := filepath.Abs(out)
	var s strings.Builder
	fmt.Fprintf(&s, header, 900, 480, abs)
	s.WriteString("set title \"Rule scale: kernel objects one farm adds to xlb's tables, by backends in the farm\"\n")
	s.WriteString("set key top left\nset bmargin 5\nset xlabel \"mode, scheduler, backends in the farm\" offset 0,-1\nset ylabel \"objects (log scale)\"\nset logscale y\nset yrange [0.8:*]\n")
	s.WriteString("set style data histogram\nset style histogram clustered gap 1\nset style fill solid 0.6 border -1\n")
	var plots []string
	for i := range kinds {
		plots = append(plots, fmt.Sprintf("'rs.dat' using %d:xtic(1) title columnhead", i+2))
	}
	s.WriteString("plot " + strings.Join(plots, ", ") + "\n")
	if err := gnuplot(tmp, s.String()); err != nil {
		return err
	}
	log.Printf("wrote %s", out)
	return nil
}

func converge(dir, tmp string, raw []byte) error {
	var doc struct {
		Machine string `json:"machine"`
		Results []struct {
			System   string    `json:"system"`
			Op       string    `json:"op"`
			Existing int       `json:"existing_farms"`
			Backends int       `json:"backends"`
			Traffic  []float64 `json:"until_traffic_ms"`
		} `json:"results"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return err
	}
	out := filepath.Join(dir, "converge.png")
	abs, _ := filepath.Abs(out)
	var s strings.Builder
	fmt.Fprintf(&s, header, 1300, 900, abs)
	s.WriteString("set termoption noenhanced\n")
	fmt.Fprintf(&s, "set multiplot layout 2,1 title %q\n", "Time from the API call (or nft -f) until traffic follows: xlb (blue), nft -f (red); boxes p25-p75 - "+doc.Machine)
	s.WriteString("set ylabel \"ms (log scale)\"\nset logscale y\nset style fill solid 0.5 border -1\nset style boxplot outliers pointtype 7\nset pointsize 0.4\nset boxwidth 0.35 absolute\n")
	block := 0
	var d strings.Builder
	for _, op := range []string{"add", "delete"} {
		var plots, tics []string
		x := 0.0
		var lastKey string
		for _, r := range doc.Results {
			if r.Op != op || r.System != "xlb" {
				continue
			}
			key := fmt.Sprintf("%d backends\\n%d farms", r.Backends, r.Existing)
			if key == lastKey {
				continue
			}
			lastKey = key
			x++
			tics = append(tics, fmt.Sprintf("\"%s\" %g", key, x))
			for _, sys := range []struct {
				name, color string
				off         float64
			}{{"xlb", "#4878a8", -0.2}, {"nft -f", "#c0504d", 0.2}} {
				for _, q := range doc.Results {
					if q.Op == op && q.System == sys.name && q.Existing == r.Existing && q.Backends == r.Backends {
						if block > 0 {
							d.WriteString("\n\n")
						}
						for _, v := range q.Traffic {
							fmt.Fprintf(&d, "%g\n", v)
						}
						plots = append(plots, fmt.Sprintf("'cv.dat' index %d using (%g):1 with boxplot lc rgb %q", block, x+sys.off, sys.color))
						block++
					}
				}
			}
		}
		if len(plots) == 0 {
			continue
		}
		fmt.Fprintf(&s, "set title %q\nset xrange [0.4:%g]\nset xtics (%s) font \",8\"\n", op+" a farm", x+0.6, strings.Join(tics, ", "))
		s.WriteString("plot " + strings.Join(plots, ", \\\n  ") + "\n")
	}
	s.WriteString("unset multiplot\n")
	if err := os.WriteFile(filepath.Join(tmp, "cv.dat"), []byte(d.String()), 0o644); err != nil {
		return err
	}
	if err := gnuplot(tmp, s.String()); err != nil {
		return err
	}
	log.Printf("wrote %s", out)
	return nil
}

func kubeCreateDelete(dir, tmp string, raw []byte) error {
	var doc struct {
		Machine string `json:"machine"`
		Date    string `json:"date"`
		Results []struct {
			Proxy     string    `json:"proxy"`
			Op        string    `json:"op"`
			Endpoints int       `json:"endpoints"`
			Samples   []float64 `json:"until_traffic_ms"`
		} `json:"results"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return err
	}
	systems := []struct {
		name, color string
		off         float64
	}{
		{"xlb nft", "#4878a8", -0.3}, {"xlb ebpf", "#6aa84f", -0.1},
		{"kube-proxy nftables", "#c0504d", 0.1}, {"kube-proxy iptables", "#e69138", 0.3},
	}
	out := filepath.Join(dir, "kube-create-delete.png")
	abs, _ := filepath.Abs(out)
	var s strings.Builder
	fmt.Fprintf(&s, header, 1300, 900, abs)
	s.WriteString("set termoption noenhanced\n")
	fmt.Fprintf(&s, "set multiplot layout 2,1 title %q\n", "Service create / delete until traffic: xlb nft (blue), xlb ebpf (green), kube-proxy nftables (red), kube-proxy iptables (orange); boxes p25-p75 - "+doc.Machine+", "+doc.Date)
	s.WriteString("set ylabel \"ms (log scale)\"\nset logscale y\nset yrange [1:5000]\nset style fill solid 0.5 border -1\nset style boxplot outliers pointtype 7\nset pointsize 0.4\nset boxwidth 0.18 absolute\n")
	var counts []int
	for _, r := range doc.Results {
		if !slices.Contains(counts, r.Endpoints) {
			counts = append(counts, r.Endpoints)
		}
	}
	slices.Sort(counts)
	block := 0
	var d strings.Builder
	for _, op := range []string{"create", "delete"} {
		var plots, tics []string
		for i, n := range counts {
			x := float64(i + 1)
			tics = append(tics, fmt.Sprintf("\"%d endpoints\" %g", n, x))
			for _, sys := range systems {
				for _, r := range doc.Results {
					if r.Op != op || r.Proxy != sys.name || r.Endpoints != n || len(r.Samples) == 0 {
						continue
					}
					if block > 0 {
						d.WriteString("\n\n")
					}
					for _, v := range r.Samples {
						fmt.Fprintf(&d, "%g\n", v)
					}
					plots = append(plots, fmt.Sprintf("'kcd.dat' index %d using (%g):1 with boxplot lc rgb %q", block, x+sys.off, sys.color))
					block++
				}
			}
		}
		if len(plots) == 0 {
			continue
		}
		title := "create a Service and its EndpointSlice until a new connection reaches an endpoint"
		if op == "delete" {
			title = "delete them until a new connection is no longer served"
		}
		fmt.Fprintf(&s, "set title %q\nset xrange [0.4:%g]\nset xtics (%s)\n", title, float64(len(counts))+0.6, strings.Join(tics, ", "))
		s.WriteString("plot " + strings.Join(plots, ", \\\n  ") + "\n")
	}
	s.WriteString("unset multiplot\n")
	if err := os.WriteFile(filepath.Join(tmp, "kcd.dat"), []byte(d.String()), 0o644); err != nil {
		return err
	}
	if err := gnuplot(tmp, s.String()); err != nil {
		return err
	}
	log.Printf("wrote %s", out)
	return nil
}

func conntable(dir, tmp string, raw []byte) error {
	var doc struct {
		Machine string `json:"machine"`
		LoadA   string `json:"loadavg_before"`
		Rows    []struct {
			Config      string  `json:"config"`
			Connections int     `json:"connections"`
			Load        string  `json:"load"`
			CPU         summary `json:"cpu_ns_per_packet"`
			Ratio       summary `json:"ratio_to_ref"`
		} `json:"results"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return err
	}
	var loads, configs []string
	for _, r := range doc.Rows {
		if !slices.Contains(loads, r.Load) {
			loads = append(loads, r.Load)
		}
		if !slices.Contains(configs, r.Config) {
			configs = append(configs, r.Config)
		}
	}
	colors := []string{"#c0504d", "#4878a8", "#2e8b57", "#8064a2", "#f79646"}
	title := map[string]string{
		"hot":    "a few busy flows next to N idle",
		"spread": "each packet another of the N",
	}
	// One data block per (load, config): connections, median, min, max of
	// the CPU per packet, then of the ratio to the reference.
	var d strings.Builder
	block := map[string]int{}
	nb := 0
	for _, l := range loads {
		for _, c := range configs {
			if nb > 0 {
				d.WriteString("\n\n")
			}
			for _, r := range doc.Rows {
				if r.Load == l && r.Config == c {
					fmt.Fprintf(&d, "%d %g %g %g %g %g %g\n", r.Connections, r.CPU.Median, r.CPU.Min, r.CPU.Max, r.Ratio.Median, r.Ratio.Min, r.Ratio.Max)
				}
			}
			block[l+"/"+c] = nb
			nb++
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, "ct.dat"), []byte(d.String()), 0o644); err != nil {
		return err
	}
	out := filepath.Join(dir, "conntable.png")
	abs, _ := filepath.Abs(out)
	var s strings.Builder
	fmt.Fprintf(&s, header, 600*len(loads), 860, abs)
	s.WriteString("set termoption noenhanced\nset key top left\nset logscale x\nset xrange [500:2e6]\nset xlabel \"tracked connections (log scale)\"\nset pointsize 0.8\n")
	fmt.Fprintf(&s, "set multiplot layout 2,%d title %q\n", len(loads), "Per-packet cost by tracked connections, client -> xlb (UDP, dnat) -> sinks; median, whiskers min-max\n"+doc.Machine+", load average "+doc.LoadA)
	for _, what := range []struct{ cols, ylabel, title string }{
		{"1:2:3:4", "ns per packet", "CPU per packet (lower: better)"},
		{"1:5:6:7", "ratio", "packets/s / reference (higher: better)"},
	} {
		for _, l := range loads {
			var plots []string
			for i, c := range configs {
				plots = append(plots, fmt.Sprintf("'ct.dat' index %d using %s with yerrorlines lc rgb %q pt 7 title %q", block[l+"/"+c], what.cols, colors[i%len(colors)], c))
			}
			fmt.Fprintf(&s, "set title %q\nset ylabel %q\nset yrange [0:*]\n", l+" ("+title[l]+"): "+what.title, what.ylabel)
			s.WriteString("plot " + strings.Join(plots, ", \\\n  ") + "\n")
		}
	}
	s.WriteString("unset multiplot\n")
	if err := gnuplot(tmp, s.String()); err != nil {
		return err
	}
	log.Printf("wrote %s", out)
	return nil
}

// tablesChart draws tables.json (bench/tablesreport): per list size, the
// median LB ns per packet of each system.
func tablesChart(dir, tmp string, raw []byte) error {
	var rep map[string]map[string]summary
	if err := json.Unmarshal(raw, &rep); err != nil {
		return err
	}
	systems := []string{"nft-0", "nft-list", "nft-set", "ebpf-0", "ebpf-list", "stls-0", "stls-list"}
	var names []string
	for n := range rep {
		names = append(names, n)
	}
	// BenchmarkTablesLBCPU/n=1000 before n=100000 before n=1000000.
	slices.SortFunc(names, func(a, b string) int { return len(a) - len(b) })
	var d strings.Builder
	d.WriteString("size")
	for _, s := range systems {
		fmt.Fprintf(&d, " %q", s)
	}
	d.WriteString("\n")
	for _, n := range names {
		fmt.Fprintf(&d, "%q", strings.TrimPrefix(n, "BenchmarkTablesLBCPU/"))
		for _, s := range systems {
			fmt.Fprintf(&d, " %g", rep[n][s+"-lb-ns/pkt"].Median)
		}
		d.WriteString("\n")
	}
	if err := os.WriteFile(filepath.Join(tmp, "tables.dat"), []byte(d.String()), 0o644); err != nil {
		return err
	}
	out := filepath.Join(dir, "tables.png")
	abs, _ := filepath.Abs(out)
	var s strings.Builder
	fmt.Fprintf(&s, header, 900, 480, abs)
	s.WriteString("set title \"CPU the LB spends per forwarded packet, with a deny list of n CIDRs (the client in none)\"\n")
	s.WriteString("set key top left\nset xlabel \"deny-list entries\"\nset ylabel \"LB ns per packet (median over rounds)\"\nset yrange [0:*]\n")
	s.WriteString("set style data histogram\nset style histogram clustered gap 1\nset style fill solid 0.6 border -1\n")
	var plots []string
	for i := range systems {
		plots = append(plots, fmt.Sprintf("'tables.dat' using %d:xtic(1) title columnhead", i+2))
	}
	s.WriteString("plot " + strings.Join(plots, ", ") + "\n")
	if err := gnuplot(tmp, s.String()); err != nil {
		return err
	}
	log.Printf("wrote %s", out)
	return nil
}
