// Command conntable measures the per-packet cost of the real load balancer
// as the number of tracked connections grows, for the nftables data plane
// (the kernel's conntrack) and the eBPF data plane (xlb's LRU conntrack
// map, with a small and a well-sized --conn-table-size), in the same run:
//
//	client ns -> lb ns (xlb daemon, UDP farm on the VIP, dnat, rr) -> 3 backends (cheap-drop sinks)
//
// For each plane and each size N it builds a fresh topology, starts the
// daemon and a UDP farm through the CLI, fills the LB's connection table
// with N distinct one-packet flows (sources 10.101.x.y:port from the client
// namespace, gen.go), checks how many entries the table really holds
// (conntrack -C in the lb namespace; the eBPF plane's xlb_ct map, counted
// through the pinned map on a bpffs this program mounts), and measures
// packets/s and CPU per packet of two loads:
//
//   - hot: a fixed set of 64 flows (-hot), already tracked, round robin:
//     what established traffic costs next to N idle connections;
//   - spread: round robin over all N+64 tracked flows, every packet another
//     connection (the worst case for the CPU caches; it also keeps every
//     entry fresh).
//
// Every run is paired with a run of the hot load through a reference
// topology built once at the start (plain forwarding in its lb namespace, no
// balancer, no conntrack), right before or after it (alternating), so the
// ratio to that reference removes most of the shared machine's drift. The
// UDP idle timeouts are raised in the lb namespace (nf_conntrack_udp_timeout,
// --ct-timeout-udp) so the filled entries stay while measuring.
//
// Must run as root in the host namespace: it creates namespaces named
// <prefix>-* and deletes them on exit, on error and on SIGINT/SIGTERM;
// nothing is sent outside them. It writes no host sysctl: the nft plane is
// capped by the host's nf_conntrack_max (read-only in a namespace), and
// sizes above it are skipped with a note.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type options struct {
	xlb, echo, out, prefix string
	sizes, tables          []int
	planes, loads          []string
	runs, hot              int
	duration               time.Duration
}

const (
	apiAddr = "127.0.0.1:5590" // inside the lb namespace
	apiKey  = "bench-key-not-secret"
	udpPort = 5353
	// maxPPS bounds every load: at most this many packets per second of run.
	maxPPS = 3_000_000
	// ctTimeout is the UDP idle timeout in the lb namespace: longer than
	// any fill plus measurement.
	ctTimeout = time.Hour
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "gen" {
		if err := gen(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	var o options
	var sizes, tables, planes, loads string
	flag.StringVar(&o.xlb, "xlb", "bin/xlb", "xlb binary")
	flag.StringVar(&o.echo, "echo", "bin/xlb-echo", "backend server binary (the topology starts one per backend)")
	flag.StringVar(&o.out, "out", "bench/results", "results directory")
	flag.StringVar(&o.prefix, "prefix", fmt.Sprintf("xlbb-%d", os.Getpid()), "prefix of the namespaces it creates")
	flag.StringVar(&sizes, "sizes", "1000,65536,250000,1000000", "tracked connections to fill the table with, comma separated")
	flag.StringVar(&tables, "tables", "65536,1048576", "ebpf --conn-table-size values (connections), comma separated")
	flag.StringVar(&planes, "planes", "nft,ebpf", "data planes: nft, ebpf")
	flag.StringVar(&loads, "loads", "hot,spread", "hot (a fixed set of flows), spread (every tracked flow in turn)")
	flag.IntVar(&o.runs, "runs", 5, "measurements of every load at every size")
	flag.IntVar(&o.hot, "hot", 64, "flows of the hot load")
	flag.DurationVar(&o.duration, "d", 3*time.Second, "duration of each measurement")
	rewriteMD := flag.Bool("rewrite", false, "only write conntable.md again from conntable.json in -out, no measuring")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("conntable: ")
	if *rewriteMD {
		if err := rewrite(o.out); err != nil {
			log.Fatal(err)
		}
		return
	}
	var err error
	if o.sizes, err = ints(sizes); err != nil {
		log.Fatalf("-sizes: %v", err)
	}
	if o.tables, err = ints(tables); err != nil {
		log.Fatalf("-tables: %v", err)
	}
	o.planes = strings.Split(planes, ",")
	o.loads = strings.Split(loads, ",")
	for _, p := range o.planes {
		if p != "nft" && p != "ebpf" {
			log.Fatalf("-planes: unknown plane %q", p)
		}
	}
	for _, l := range o.loads {
		if l != "hot" && l != "spread" {
			log.Fatalf("-loads: unknown load %q", l)
		}
	}
	if o.runs < 1 || o.duration < 500*time.Millisecond || o.duration > time.Minute || o.hot < 1 || o.hot > 4096 {
		log.Fatal("-runs must be >= 1, -d between 0.5s and 1m, -hot between 1 and 4096")
	}
	if os.Geteuid() != 0 {
		log.Fatal("run as root: it creates network namespaces")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		log.Print(err)
		stop()
		os.Exit(1)
	}
}

func ints(s string) ([]int, error) {
	var v []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 4_000_000 {
			return nil, fmt.Errorf("%q: want whole numbers from 1 to 4000000", f)
		}
		v = append(v, n)
	}
	return v, nil
}

// config is one plane and table size under test.
type config struct {
	plane string // nft, ebpf
	table int    // ebpf --conn-table-size; 0 for nft
}

func (c config) String() string {
	if c.plane == "nft" {
		return "nft"
	}
	return fmt.Sprintf("ebpf table=%s", human(c.table))
}

func human(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMi", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKi", n>>10)
	}
	return strconv.Itoa(n)
}

func run(ctx context.Context, o options) error {
	for _, bin := range []string{o.xlb, o.echo} {
		if _, err := os.Stat(bin); err != nil {
			return fmt.Errorf("binary %s: %w (make build first)", bin, err)
		}
	}
	for _, tool := range []string{"ip", "nft", "conntrack", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: %w (scripts/install-deps.sh installs it)", tool, err)
		}
	}
	o.xlb, _ = filepath.Abs(o.xlb)
	o.echo, _ = filepath.Abs(o.echo)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var notes []string
	ctMax := readInt("/proc/sys/net/netfilter/nf_conntrack_max")
	buckets := readInt("/proc/sys/net/netfilter/nf_conntrack_buckets")

	var configs []config
	for _, p := range o.planes {
		if p == "nft" {
			configs = append(configs, config{plane: "nft"})
			continue
		}
		help, _ := exec.Command(o.xlb, "daemon", "--help").CombinedOutput()
		if !regexp.MustCompile(`--dataplane.*ebpf`).Match(help) {
			return errors.New("-planes ebpf: `xlb daemon --help` does not list an ebpf data plane in this build")
		}
		for _, t := range o.tables {
			configs = append(configs, config{plane: "ebpf", table: t})
		}
	}

	var bpffs string
	if containsStr(o.planes, "ebpf") {
		// The daemons pin their maps here (--pin-path), where this program
		// can open the conntrack map to count it; unmounted at the end.
		if bpffs, err = os.MkdirTemp("", o.prefix+"-bpffs-"); err != nil {
			return err
		}
		if err := syscall.Mount("bpf", bpffs, "bpf", 0, "mode=0700"); err != nil {
			os.Remove(bpffs)
			return fmt.Errorf("mount bpffs at %s: %w", bpffs, err)
		}
		defer func() {
			if err := syscall.Unmount(bpffs, syscall.MNT_DETACH); err != nil {
				log.Printf("unmount %s: %v", bpffs, err)
			}
			os.Remove(bpffs)
		}()
	}

	// The reference: plain forwarding, measured next to every run.
	ref, err := newBench(ctx, o, self, config{plane: "ref"}, "")
	if err != nil {
		return fmt.Errorf("reference topology: %w", err)
	}
	defer ref.close()
	if err := ref.checkHot(ctx); err != nil {
		return fmt.Errorf("reference: %w", err)
	}

	start := time.Now()
	var rows []*row
	seq := 0
	for _, n := range o.sizes {
		for _, c := range configs {
			if err := ctx.Err(); err != nil {
				return err
			}
			if c.plane == "nft" && ctMax > 0 && n+o.hot > ctMax*97/100 {
				note := fmt.Sprintf("nft at %d connections skipped: the host's nf_conntrack_max is %d (read-only inside a network namespace, and this benchmark writes no host sysctl), so the kernel's conntrack cannot hold them; the largest nft size is what fits under it.", n, ctMax)
				if !containsStr(notes, note) {
					notes = append(notes, note)
				}
				log.Printf("skip nft at %d connections: nf_conntrack_max %d", n, ctMax)
				continue
			}
			seq++
			pin := ""
			if c.plane == "ebpf" {
				pin = filepath.Join(bpffs, fmt.Sprintf("xlb-%d", seq))
			}
			rs, err := measureConfig(ctx, o, self, ref, c, n, pin, seq)
			if err != nil {
				return fmt.Errorf("%s, %d connections: %w", c, n, err)
			}
			rows = append(rows, rs...)
		}
	}
	notes = append(notes,
		fmt.Sprintf("Loads: hot = %d flows already tracked, round robin; spread = round robin over every tracked flow (N + %d), each packet another connection. %d runs of %s per load and size; every run paired with a reference run (hot flows through a topology with plain forwarding, no balancer), alternately before and after it.", o.hot, o.hot, o.runs, o.duration),
		fmt.Sprintf("Generator: 18-byte UDP datagrams (64-byte frames) from a raw socket in the client namespace, sendmmsg batches of %d, sources 10.101.x.y:1024-65023 (routed back to the client by the lb), at most %d packets per second of run. The backends drop them in nftables at prerouting priority -300 (before conntrack) and count them: packets/s is what the sinks counted divided by the sending time.", genBatch, maxPPS),
		"CPU: cpu_ns_per_packet is the CPU time of the generator's sending thread (getrusage RUSAGE_THREAD) per packet received: over veth the LB's and the backends' softirq work runs on the sending CPU when the send returns, so it covers client, LB and sink; lb_added_ns_per_packet is that minus the paired reference run's (what the balancer adds per packet). softirq_ns_per_packet is the machine-wide softirq time (/proc/stat) per packet, noisy on a shared machine.",
		fmt.Sprintf("Farm: UDP, mode dnat, rr over the 3 backends, created with the xlb CLI (dnat: snat would cap the flows at the source ports free per backend). UDP idle timeout raised to %s in the lb namespace (nft: net.netfilter.nf_conntrack_udp_timeout, per namespace; ebpf: --ct-timeout-udp).", ctTimeout),
		fmt.Sprintf("Fill: N one-packet flows (10.101.x.y source addresses and ports), then the table is counted (nft: conntrack -C in the lb namespace; ebpf: forward entries of the pinned xlb_ct map, one per connection); missing flows are sent again (at most 3 passes). entries_after is the count after the measurement. The kernel's conntrack hash (nf_conntrack_buckets = %d) is shared by every namespace of the host.", buckets),
		"ebpf tables: --conn-table-size is in connections (2 LRU entries each, one per direction). No reply ever comes here, so the LRU evicts the unused reply entries first (the program rebuilds one from its forward entry when a reply comes): a table of T connections keeps up to 2T of these one-way flows. Beyond that it holds what its LRU keeps; the hot flows stay (recently used), and the spread load creates flows as fast as it evicts them (new_flow_percent: new flows / (new flows + conntrack hits) in the program's xlb_stats counters).",
		fmt.Sprintf("Total wall time %s.", time.Since(start).Round(time.Second)),
	)
	return write(o, rows, notes)
}

func readInt(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

func containsStr(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
