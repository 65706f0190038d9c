package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/xlb-lb/xlb/bench/internal/results"
	"github.com/xlb-lb/xlb/bench/internal/stats"
)

// sample is one measurement of one load.
type sample struct {
	PPS            float64 `json:"packets_per_sec"`
	Sent           float64 `json:"sent"`
	Received       float64 `json:"received"`
	Seconds        float64 `json:"seconds"`
	LossPct        float64 `json:"loss_percent"`
	CPUNsPerPkt    float64 `json:"cpu_ns_per_packet"`
	SoftirqNsPkt   float64 `json:"softirq_ns_per_packet"`
	NewFlowPct     float64 `json:"new_flow_percent,omitempty"`
	RefPPS         float64 `json:"ref_packets_per_sec"`
	RefCPUNsPerPkt float64 `json:"ref_cpu_ns_per_packet"`
	RatioToRef     float64 `json:"ratio_to_ref"`
	AddedNsPerPkt  float64 `json:"lb_added_ns_per_packet"`
}

// row is one plane/table at one size under one load.
type row struct {
	Config        string        `json:"config"`
	Plane         string        `json:"plane"`
	Table         int           `json:"table_size,omitempty"`
	Connections   int           `json:"connections"`
	Load          string        `json:"load"`
	EntriesFilled int           `json:"entries_filled"`
	EntriesAfter  int           `json:"entries_after"`
	FillPasses    int           `json:"fill_passes"`
	FillSeconds   float64       `json:"fill_seconds"`
	PPS           stats.Summary `json:"packets_per_sec"`
	Ratio         stats.Summary `json:"ratio_to_ref"`
	CPU           stats.Summary `json:"cpu_ns_per_packet"`
	Added         stats.Summary `json:"lb_added_ns_per_packet"`
	Softirq       stats.Summary `json:"softirq_ns_per_packet"`
	Loss          stats.Summary `json:"loss_percent"`
	NewFlow       stats.Summary `json:"new_flow_percent"`
	// Median CPU per packet divided by the same at the smallest size of
	// this config and load: 1 is flat, above 1 costs more.
	CPUVsSmallest float64  `json:"cpu_vs_smallest,omitempty"`
	Runs          []sample `json:"runs"`
}

type report struct {
	Date       string   `json:"date"`
	Machine    string   `json:"machine"`
	LoadBefore string   `json:"loadavg_before"`
	LoadAfter  string   `json:"loadavg_after"`
	CtMax      int      `json:"host_nf_conntrack_max"`
	CtBuckets  int      `json:"host_nf_conntrack_buckets"`
	Notes      []string `json:"notes"`
	Rows       []*row   `json:"results"`
}

var loadAtStart = loadavg()

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// rewrite writes conntable.md again from conntable.json (-rewrite).
func rewrite(dir string) error {
	raw, err := os.ReadFile(filepath.Join(dir, "conntable.json"))
	if err != nil {
		return err
	}
	var rep report
	if err := json.Unmarshal(raw, &rep); err != nil {
		return err
	}
	summarize(rep.Rows)
	return os.WriteFile(filepath.Join(dir, "conntable.md"), []byte(markdown(rep)), 0o644)
}

// summarize fills the summaries of rows from their runs.
func summarize(rows []*row) {
	col := func(r *row, f func(sample) float64) stats.Summary {
		var v []float64
		for _, s := range r.Runs {
			v = append(v, f(s))
		}
		return stats.Summarize(v)
	}
	smallest := map[string]float64{}
	for _, r := range rows {
		r.PPS = col(r, func(s sample) float64 { return s.PPS })
		r.Ratio = col(r, func(s sample) float64 { return s.RatioToRef })
		r.CPU = col(r, func(s sample) float64 { return s.CPUNsPerPkt })
		r.Added = col(r, func(s sample) float64 { return s.AddedNsPerPkt })
		r.Softirq = col(r, func(s sample) float64 { return s.SoftirqNsPkt })
		r.Loss = col(r, func(s sample) float64 { return s.LossPct })
		r.NewFlow = col(r, func(s sample) float64 { return s.NewFlowPct })
		k := r.Config + "/" + r.Load
		if _, ok := smallest[k]; !ok {
			smallest[k] = r.CPU.Median // rows come smallest size first
		}
		if s := smallest[k]; s > 0 {
			r.CPUVsSmallest = r.CPU.Median / s
		}
	}
}

func write(o options, rows []*row, notes []string) error {
	summarize(rows)
	rep := report{
		Date: time.Now().UTC().Format(time.RFC3339), Machine: machine(),
		LoadBefore: loadAtStart, LoadAfter: loadavg(),
		CtMax:     readInt("/proc/sys/net/netfilter/nf_conntrack_max"),
		CtBuckets: readInt("/proc/sys/net/netfilter/nf_conntrack_buckets"),
		Notes:     notes, Rows: rows,
	}
	return results.Write(o.out, "conntable", rep, markdown(rep))
}

func markdown(rep report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Connection table: per-packet cost by tracked connections\n\n")
	fmt.Fprintf(&b, "Measured %s on %s (`bench/conntable`, `bench/run.sh conntable`). Load average (1/5/15 min) %s at the start, %s at the end: the machine is shared, read the spread before small differences.\n\n",
		rep.Date, rep.Machine, rep.LoadBefore, rep.LoadAfter)
	b.WriteString("client -> lb (xlb daemon, UDP farm on the VIP, dnat, rr) -> 3 backends that drop the packets before conntrack. ")
	b.WriteString("**ratio to ref**: packets/s divided by the paired reference run's (the same hot flows through a topology with plain forwarding, no balancer). ")
	b.WriteString("**cpu ns/pkt**: CPU of the sending thread per packet received (client, LB and sink run there); **cpu vs smallest**: its median divided by the same at the smallest size of the same plane and load (1.000: flat); **LB adds**: cpu ns/pkt minus the paired reference run's. Median of the runs, min-max after it. ")
	b.WriteString("On a busy shared machine packets/s follows the CPU share the generator gets more than the path's cost: read the CPU per packet first.\n\n")
	for _, load := range []string{"hot", "spread"} {
		var rs []*row
		for _, r := range rep.Rows {
			if r.Load == load {
				rs = append(rs, r)
			}
		}
		if len(rs) == 0 {
			continue
		}
		if load == "hot" {
			b.WriteString("## hot: a fixed set of tracked flows next to N idle connections\n\n")
		} else {
			b.WriteString("## spread: every packet another tracked connection (round robin over all N)\n\n")
		}
		b.WriteString("| plane | connections | tracked (filled / after) | packets/s median | min-max | ratio to ref | min-max | cpu ns/pkt | min-max | cpu vs smallest | LB adds ns/pkt | softirq ns/pkt (machine) | loss % | new flows % |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range rs {
			nf := "-"
			if r.Plane == "ebpf" {
				nf = fmt.Sprintf("%.1f", r.NewFlow.Median)
			}
			fmt.Fprintf(&b, "| %s | %d | %d / %d | %.0f | %.0f-%.0f | %.3f | %.3f-%.3f | %.0f | %.0f-%.0f | %.3f | %+.0f | %.0f | %.1f | %s |\n",
				r.Config, r.Connections, r.EntriesFilled, r.EntriesAfter, r.PPS.Median, r.PPS.Min, r.PPS.Max,
				r.Ratio.Median, r.Ratio.Min, r.Ratio.Max, r.CPU.Median, r.CPU.Min, r.CPU.Max, r.CPUVsSmallest, r.Added.Median,
				r.Softirq.Median, r.Loss.Median, nf)
		}
		b.WriteString("\n")
	}
	b.WriteString("## Fill: N new flows into the table\n\n")
	b.WriteString("Seconds from the first packet until the table was counted, counting and the wait for the sinks (about 0.2 s) included: at the small sizes that overhead is most of it.\n\n")
	b.WriteString("| plane | connections | tracked after the fill | passes | seconds | new flows/s |\n|---|---|---|---|---|---|\n")
	for _, r := range rep.Rows {
		if r.Load != rep.Rows[0].Load || r.FillSeconds <= 0 {
			continue
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %.1f | %.0f |\n", r.Config, r.Connections, r.EntriesFilled, r.FillPasses, r.FillSeconds,
			float64(r.Connections*r.FillPasses)/r.FillSeconds)
	}
	b.WriteString("\n")
	b.WriteString("How it was measured:\n\n")
	for _, n := range rep.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	fmt.Fprintf(&b, "- Host: nf_conntrack_max %d, nf_conntrack_buckets %d (global, not changed by the benchmark).\n", rep.CtMax, rep.CtBuckets)
	return b.String()
}

// machine describes where the run happened: kernel, CPU model and count.
func machine() string {
	k, _ := exec.Command("uname", "-r").Output()
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				if _, v, ok := strings.Cut(l, ":"); ok {
					cpu = strings.TrimSpace(v)
				}
				break
			}
		}
	}
	return fmt.Sprintf("Linux %s, %d x %s", strings.TrimSpace(string(k)), runtime.NumCPU(), cpu)
}
