package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/xlb-lb/xlb/bench/internal/results"
	"github.com/xlb-lb/xlb/bench/internal/stats"
)

// row is one system under one load in datapath.json.
type row struct {
	System  string        `json:"system"`
	Load    string        `json:"load"`
	Desc    string        `json:"description"`
	ReqPS   stats.Summary `json:"req_per_sec"`
	P50     stats.Summary `json:"p50_ms"`
	P99     stats.Summary `json:"p99_ms"`
	Softirq stats.Summary `json:"softirq_us_per_req"`
	Busy    stats.Summary `json:"machine_cpu_us_per_req"`
	LBProc  stats.Summary `json:"lb_process_cpu_us_per_req"`
	Loss    stats.Summary `json:"udp_loss_percent"`
	// Median req/s divided by the median of direct and of plain nftables
	// under the same load, in the same run.
	RatioDirect float64 `json:"ratio_to_direct,omitempty"`
	RatioNft    float64 `json:"ratio_to_nft,omitempty"`
	// Req/s difference to plain nftables with 95 % confidence (Welch).
	VsNft *stats.Diff `json:"req_per_sec_vs_nft,omitempty"`
	Runs  []sample    `json:"runs"`
}

type report struct {
	Date    string            `json:"date"`
	Machine string            `json:"machine"`
	Notes   []string          `json:"notes"`
	Skipped map[string]string `json:"skipped,omitempty"`
	Rows    []row             `json:"results"`
}

func write(o options, order []string, ms map[string]*measurement, notes []string, skipped map[string]string) error {
	col := func(m *measurement, f func(sample) float64) []float64 {
		var v []float64
		for _, s := range m.Runs {
			v = append(v, f(s))
		}
		return v
	}
	rep := report{Date: time.Now().UTC().Format(time.RFC3339), Machine: machine(), Notes: notes, Skipped: skipped}
	for _, k := range order {
		m := ms[k]
		r := row{
			System: m.System, Load: m.Load, Desc: m.Desc, Runs: m.Runs,
			ReqPS:   stats.Summarize(col(m, func(s sample) float64 { return s.ReqPerSec })),
			P50:     stats.Summarize(col(m, func(s sample) float64 { return s.P50ms })),
			P99:     stats.Summarize(col(m, func(s sample) float64 { return s.P99ms })),
			Softirq: stats.Summarize(col(m, func(s sample) float64 { return s.SoftirqUs })),
			Busy:    stats.Summarize(col(m, func(s sample) float64 { return s.BusyUs })),
			LBProc:  stats.Summarize(col(m, func(s sample) float64 { return s.LBProcUs })),
			Loss:    stats.Summarize(col(m, func(s sample) float64 { return s.LossPct })),
		}
		rps := col(m, func(s sample) float64 { return s.ReqPerSec })
		if d, ok := ms["direct/"+m.Load]; ok {
			r.RatioDirect = r.ReqPS.Median / stats.Summarize(col(d, func(s sample) float64 { return s.ReqPerSec })).Median
		}
		if n, ok := ms["nft/"+m.Load]; ok {
			nrps := col(n, func(s sample) float64 { return s.ReqPerSec })
			r.RatioNft = r.ReqPS.Median / stats.Summarize(nrps).Median
			if m.System != "nft" {
				if d, ok := stats.Compare(rps, nrps); ok {
					r.VsNft = &d
				}
			}
		}
		rep.Rows = append(rep.Rows, r)
	}
	return results.Write(o.out, "datapath", rep, markdown(rep))
}

func markdown(rep report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Data path: client -> VIP -> 3 backends\n\nMeasured %s on %s.\n\n", rep.Date, rep.Machine)
	for _, r := range rep.Rows {
		if r.Load != "udp" {
			b.WriteString("HTTP through wrk:\n\n")
			b.WriteString("| system | load | req/s median | req/s min-max | vs direct | vs nft | vs nft, 95 % conf. | p50 ms | p99 ms | softirq µs/req | machine CPU µs/req | LB process µs/req |\n")
			b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
			break
		}
	}
	conf := func(r row) string {
		if r.VsNft != nil {
			c := fmt.Sprintf("%+.1f %% ± %.1f %%", r.VsNft.Percent, r.VsNft.PlusMinus)
			if !r.VsNft.Significant {
				c += " (no difference proven)"
			}
			return c
		} else if r.System == "nft" {
			return "baseline"
		}
		return "n/a"
	}
	var udp []row
	for _, r := range rep.Rows {
		if r.Load == "udp" {
			udp = append(udp, r)
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %.0f | %.0f-%.0f | %s | %s | %s | %.2f | %.2f | %.1f | %.1f | %.1f |\n",
			r.System, r.Load, r.ReqPS.Median, r.ReqPS.Min, r.ReqPS.Max, ratio(r.RatioDirect), ratio(r.RatioNft), conf(r),
			r.P50.Median, r.P99.Median, r.Softirq.Median, r.Busy.Median, r.LBProc.Median)
	}
	if len(udp) > 0 {
		b.WriteString("\nUDP packets/s (64-byte frames, counted where the backends drop them):\n\n")
		b.WriteString("| system | packets/s median | min-max | vs direct | vs nft | vs nft, 95 % conf. | loss % | softirq µs/packet | machine CPU µs/packet |\n|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range udp {
			fmt.Fprintf(&b, "| %s | %.0f | %.0f-%.0f | %s | %s | %s | %.1f | %.2f | %.2f |\n",
				r.System, r.ReqPS.Median, r.ReqPS.Min, r.ReqPS.Max, ratio(r.RatioDirect), ratio(r.RatioNft), conf(r),
				r.Loss.Median, r.Softirq.Median, r.Busy.Median)
		}
	}
	b.WriteString("\nSystems:\n\n")
	seen := map[string]bool{}
	for _, r := range rep.Rows {
		if !seen[r.System] {
			seen[r.System] = true
			fmt.Fprintf(&b, "- **%s**: %s\n", r.System, r.Desc)
		}
	}
	b.WriteString("\nHow it was measured:\n\n")
	for _, n := range rep.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	return b.String()
}

func ratio(v float64) string {
	if v == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.3f", v)
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
