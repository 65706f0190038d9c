package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Grid of a Grafana dashboard: 24 columns; the picture gives a grid row
// rowPx pixels.
const (
	gridCols = 24
	widthPx  = 1800
	rowPx    = 30
	headerPx = 70
)

// draw writes the panels as a PNG: each panel where its gridPos puts it.
func draw(d *dashboardJSON, data map[int][][]series, start, end time.Time, out string) error {
	dir, err := os.MkdirTemp("", "xlb-dashboard-plot-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	rows := 0
	for _, p := range d.Panels {
		rows = max(rows, p.GridPos.Y+p.GridPos.H)
	}
	heightPx := headerPx + rows*rowPx
	fy := func(px int) float64 { return float64(px) / float64(heightPx) }
	var g strings.Builder
	fmt.Fprintf(&g, "set terminal pngcairo size %d,%d font 'DejaVu Sans,9' background '#111217'\n", widthPx, heightPx)
	fmt.Fprintf(&g, "set output %q\n", out)
	g.WriteString("set termoption noenhanced\n") // labels hold _ and {}
	g.WriteString("set multiplot\n")
	g.WriteString("set border lc '#9fa7b3'; set tics textcolor '#c7d0d9'; set key textcolor '#c7d0d9'; set title textcolor '#d8d9da'\n")
	g.WriteString("set grid lc '#2c3235'\n")
	colors := []string{"#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#705da0", "#37872d", "#fade2a", "#c4162a", "#1f60c4"}
	// The page's header: the dashboard title and what the picture is.
	fmt.Fprintf(&g, "set origin 0,%f; set size 1,%f\n", 1-fy(headerPx), fy(headerPx))
	g.WriteString("unset border; unset tics; unset key; unset grid; set xrange [0:1]; set yrange [0:1]\n")
	fmt.Fprintf(&g, "set label 1 %q at 0.005,0.65 font 'DejaVu Sans,16' textcolor '#d8d9da'\n",
		fmt.Sprintf("%s — Grafana dashboard deploy/grafana/xlb-dashboard.json", d.Title))
	fmt.Fprintf(&g, "set label 2 %q at 0.005,0.25 font 'DejaVu Sans,10' textcolor '#9fa7b3'\n",
		fmt.Sprintf("Its panels' queries run against Prometheus 2.42 scraping xlb (eBPF plane) every 2 s, %s to %s UTC (bench/dashboard); drawn by gnuplot, not by Grafana. Time axes in minutes.",
			start.UTC().Format("2006-01-02 15:04:05"), end.UTC().Format("15:04:05")))
	g.WriteString("plot NaN notitle\nunset label\nset border; set tics; set grid\n")
	span := end.Sub(start).Seconds()
	for _, p := range d.Panels {
		x := float64(p.GridPos.X) / gridCols
		w := float64(p.GridPos.W) / gridCols
		top := headerPx + p.GridPos.Y*rowPx
		h := fy(p.GridPos.H * rowPx)
		y := 1 - fy(top) - h
		fmt.Fprintf(&g, "reset\nset termoption noenhanced\nset origin %f,%f; set size %f,%f\n", x, y, w, h)
		g.WriteString("set border lc '#9fa7b3'; set tics textcolor '#c7d0d9'; set key textcolor '#c7d0d9'; set title textcolor '#d8d9da'; set grid lc '#2c3235'\n")
		fmt.Fprintf(&g, "set title %q font 'DejaVu Sans,11'\n", p.Title)
		var plots []string
		k := 0
		for _, ss := range data[p.ID] {
			for _, s := range ss {
				file := filepath.Join(dir, fmt.Sprintf("p%d-%d.dat", p.ID, k))
				var b strings.Builder
				for i := range s.t {
					fmt.Fprintf(&b, "%f %g\n", s.t[i]/60, s.v[i])
				}
				if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
					return err
				}
				switch p.Type {
				case "state-timeline":
					// Up (green) and down (red) bands, one row a series.
					plots = append(plots,
						fmt.Sprintf("%q using 1:(%d):(%d+0.8*(1-$2)) with filledcurves fc '#37872d' notitle", file, k, k),
						fmt.Sprintf("%q using 1:(%d):(%d+0.8*$2) with filledcurves fc '#c4162a' notitle", file, k, k))
					fmt.Fprintf(&g, "set ytics add (%q %f)\n", s.label, float64(k)+0.4)
				case "stat":
					if k == 0 && len(s.v) > 0 {
						fmt.Fprintf(&g, "set label 1 %q at graph 0.5,0.5 center font 'DejaVu Sans,26' textcolor '#73bf69' front\n",
							statText(s.v[len(s.v)-1], p.FieldConfig.Defaults.Unit))
					}
					plots = append(plots, fmt.Sprintf("%q using 1:2 with filledcurves y1=0 fc '#1f3a26' notitle", file))
				default:
					title := s.label
					if title == "" {
						title = "value"
					}
					plots = append(plots, fmt.Sprintf("%q using 1:2 with lines lw 1.5 lc rgb '%s' title %q", file, colors[k%len(colors)], title))
				}
				k++
			}
		}
		fmt.Fprintf(&g, "set xrange [0:%f]\n", span/60)
		switch p.Type {
		case "state-timeline":
			fmt.Fprintf(&g, "set yrange [-0.2:%f]; set ytics scale 0 font ',8'; unset key; set xtics font ',8'\n", float64(k))
		case "stat":
			g.WriteString("unset tics; unset key; unset grid; set border 0; set yrange [0:*]\n")
		default:
			fmt.Fprintf(&g, "set key outside bottom center horizontal font ',7' samplen 1.5 maxrows 3; set xtics font ',8'; set ytics font ',8'; set yrange [0:*]; set format y %q\n", yFormat(p.FieldConfig.Defaults.Unit))
		}
		if len(plots) == 0 {
			g.WriteString("set label 9 'no data' at graph 0.5,0.5 center textcolor '#9fa7b3'\nplot NaN notitle\n")
			continue
		}
		fmt.Fprintf(&g, "plot %s\n", strings.Join(plots, ", \\\n  "))
	}
	g.WriteString("unset multiplot\n")
	script := filepath.Join(dir, "dashboard.gp")
	if err := os.WriteFile(script, []byte(g.String()), 0o644); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	if o, err := exec.Command("gnuplot", script).CombinedOutput(); err != nil {
		return fmt.Errorf("gnuplot: %w: %s", err, o)
	}
	return nil
}

// yFormat is the axis format of a Grafana unit (gnuplot's %s%c: mantissa
// and SI prefix).
func yFormat(unit string) string {
	switch unit {
	case "s":
		return "%.1s%cs"
	case "bps":
		return "%.0s%cb/s"
	case "pps":
		return "%.1s%c p/s"
	case "cps":
		return "%.0f/s"
	case "reqps":
		return "%.2f/s"
	case "percentunit":
		return "%.0f"
	}
	return "%.0s%c"
}

// statText is a stat panel's value in its unit.
func statText(v float64, unit string) string {
	si := func(v float64, suffix string) string {
		for _, p := range []struct {
			f float64
			s string
		}{{1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
			if v >= p.f {
				return fmt.Sprintf("%.1f %s%s", v/p.f, p.s, suffix)
			}
		}
		return fmt.Sprintf("%.0f %s", v, suffix)
	}
	switch unit {
	case "percentunit":
		return fmt.Sprintf("%.2f%%", v*100)
	case "s":
		if v < 1 {
			return fmt.Sprintf("%.2f ms", v*1000)
		}
		return fmt.Sprintf("%.2f s", v)
	case "bps":
		return si(v, "b/s")
	case "cps":
		return fmt.Sprintf("%.0f /s", v)
	}
	return fmt.Sprintf("%g", v)
}
