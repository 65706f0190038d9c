// Package setup is the data plane part of both binaries' command lines:
// the flags (--dataplane and each plane's options), their validation, and
// opening the plane they describe. `xlb daemon` and `xlb kube-proxy` take
// the same flags with the same meanings; only a few defaults differ (the
// proxy keeps its own table and pin path, so both can run on one host).
package setup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/ebpf"
	"github.com/xlb-lb/xlb/internal/dataplane/nft"
	"github.com/xlb-lb/xlb/internal/model"
)

// PlaneNames are the values --dataplane accepts.
const PlaneNames = "nft, ebpf"

// Bounds of --conn-table-size (connections).
const (
	DefaultConnTableSize = 131072
	MaxConnTableSize     = 1 << 26
)

// Defaults are what differs between the binaries.
type Defaults struct {
	NFTTable string // --nft-table
	PinPath  string // --pin-path
}

// DaemonDefaults are xlb daemon's: table xlb (xlb-00, ...), pins under
// /sys/fs/bpf/xlb.
var DaemonDefaults = Defaults{NFTTable: nft.DefaultTable, PinPath: ebpf.DefaultPinPath}

// Flags are the data plane flags, once parsed.
type Flags struct {
	// Plane is --dataplane: "nft" or "ebpf".
	Plane string
	// NFTTable is the inet table the nft plane owns, or with NFTTables >
	// 1 the prefix of its tables (<name>-00, <name>-01, ...).
	NFTTable  string
	NFTTables int
	// NFTCounters is --nft-counters: the nft plane's traffic counters
	// (one set lookup per forwarded packet).
	NFTCounters bool
	// ConnTableSize is the number of connections tracked: for ebpf its
	// conntrack table (two entries per connection); for nft the kernel's
	// nf_conntrack_max and nf_conntrack_buckets, set only when the flag is
	// given (ConnTableSet).
	ConnTableSize int
	ConnTableSet  bool
	// SNATPorts is --snat-ports: the source ports of this node's snat
	// connections, both planes (zero: the plane's default).
	SNATPorts     model.PortRange
	snatPortsFlag string
	// eBPF only.
	Interfaces         []string // names or patterns; empty: every interface but loopback
	PinPath            string
	SocketCgroup       string // cgroup v2 directory of socket-level balancing; empty: off
	XDP                string // off, generic, native
	Timeouts           ebpf.Timeouts
	BridgePortRedirect bool
	// PoliciesOnOutput (not a flag: xlb kube-proxy sets it) checks
	// farms' policies for the node's own connections too, as kube-proxy
	// filters them by loadBalancerSourceRanges (nft: at the output hook;
	// ebpf: the socket programs, at connect time).
	PoliciesOnOutput bool

	set *pflag.FlagSet
}

// ebpfOnly and nftOnly are the flags of one plane. --pin-path and
// --nft-table name the other plane's objects too, which each plane
// removes at start (cleanup.go), so both are taken with either plane.
var (
	ebpfOnly = []string{"interfaces", "xdp", "bridge-port-redirect", "socket-lb-cgroup",
		"ct-timeout-tcp", "ct-timeout-tcpfin", "ct-timeout-udp", "ct-timeout-syn", "ct-timeout-close"}
	nftOnly = []string{"nft-tables", "nft-counters"}
)

// Register adds the data plane flags to fs.
func (c *Flags) Register(fs *pflag.FlagSet, d Defaults) {
	c.set = fs
	fs.StringVar(&c.Plane, "dataplane", "nft", "kernel data plane: "+PlaneNames)
	fs.StringVar(&c.NFTTable, "nft-table", d.NFTTable, "nft: the inet table (and netdev table) xlb owns; with --nft-tables > 1 the prefix of its tables (<name>-00, ...); ebpf: the tables of an earlier nft plane, removed at start")
	fs.IntVar(&c.NFTTables, "nft-tables", nft.DefaultShards, fmt.Sprintf("nft: tables the farms are spread over (1-%d; a change costs in proportion to the farms of its table)", nft.MaxShards))
	fs.BoolVar(&c.NFTCounters, "nft-counters", true, "nft: count connections, packets and bytes per backend (xlb list --stats, --rate, metrics; one set lookup per forwarded packet)")
	fs.IntVar(&c.ConnTableSize, "conn-table-size", DefaultConnTableSize, "connections tracked: ebpf: its conntrack table (352 bytes of kernel memory each); nft: sets the kernel's nf_conntrack_max and nf_conntrack_buckets (host network namespace only; unset: left alone)")
	fs.StringVar(&c.snatPortsFlag, "snat-ports", "", "source ports of this node's snat connections, FIRST-LAST (default: ebpf 1024-65535, nft the kernel's choice); nodes that share a farm's source-addr need disjoint ranges (docs/ha.md)")
	fs.StringSliceVar(&c.Interfaces, "interfaces", nil, "ebpf: interfaces to attach to, by name or shell pattern (veth*, lxc*); interfaces created later are attached as they appear (default every interface but loopback)")
	fs.StringVar(&c.SocketCgroup, "socket-lb-cgroup", "", "ebpf: balance the connections of this cgroup v2's processes (the node's own: host processes, hostNetwork Pods) at the socket, at connect time (e.g. /sys/fs/cgroup); empty: off")
	fs.StringVar(&c.PinPath, "pin-path", d.PinPath, "ebpf: bpffs directory where maps and links are pinned; nft: where an earlier eBPF plane pinned them, removed at start")
	fs.StringVar(&c.XDP, "xdp", string(ebpf.XDPOff), "ebpf: XDP fast path for tracked dsr flows: off, generic (any driver), native (XDP drivers)")
	fs.BoolVar(&c.BridgePortRedirect, "bridge-port-redirect", false, "ebpf: send packets for backends behind a bridge without VLAN filtering straight to their container's veth (skips the bridge's transmit and output hooks)")
	t := ebpf.DefaultTimeouts
	fs.DurationVar(&c.Timeouts.TCP, "ct-timeout-tcp", t.TCP, "ebpf: idle timeout of established TCP connections")
	fs.DurationVar(&c.Timeouts.TCPFin, "ct-timeout-tcpfin", t.TCPFin, "ebpf: idle timeout of TCP connections after a FIN")
	fs.DurationVar(&c.Timeouts.UDP, "ct-timeout-udp", t.UDP, "ebpf: idle timeout of UDP flows")
	fs.DurationVar(&c.Timeouts.SYN, "ct-timeout-syn", t.SYN, "ebpf: idle timeout of TCP connections before the handshake completes")
	fs.DurationVar(&c.Timeouts.Close, "ct-timeout-close", t.Close, "ebpf: idle timeout of TCP connections after a RST")
}

// Check validates the flags after parsing: each plane's flags only with
// that plane, every value in range. The error names the flag, the value
// and what is allowed.
func (c *Flags) Check() error {
	changed := func(string) bool { return false }
	if c.set != nil {
		changed = c.set.Changed
	}
	c.ConnTableSet = changed("conn-table-size")
	if c.ConnTableSize < 1 || c.ConnTableSize > MaxConnTableSize {
		return fmt.Errorf("--conn-table-size %d: allowed values are 1 to %d", c.ConnTableSize, MaxConnTableSize)
	}
	if c.snatPortsFlag != "" {
		r, err := ParseSNATPorts(c.snatPortsFlag)
		if err != nil {
			return err
		}
		c.SNATPorts = r
	}
	var other []string
	switch c.Plane {
	case "nft":
		other = ebpfOnly
		if c.NFTTables < 1 || c.NFTTables > nft.MaxShards {
			return fmt.Errorf("--nft-tables %d: allowed values are 1 to %d", c.NFTTables, nft.MaxShards)
		}
		if c.NFTTable == "" {
			return errors.New(`--nft-table "": must name a table (e.g. xlb)`)
		}
		if c.PinPath == "" {
			return errors.New("--pin-path: must be a directory on a bpf file system")
		}
	case "ebpf":
		other = nftOnly
		if _, err := ebpf.ParseXDPMode(c.XDP); err != nil {
			return err
		}
		if c.PinPath == "" {
			return errors.New("--pin-path: must be a directory on a bpf file system")
		}
		if err := ebpf.ValidateInterfaces(c.Interfaces); err != nil {
			return err
		}
		if c.SocketCgroup != "" {
			if err := ebpf.CheckCgroup(c.SocketCgroup); err != nil {
				return err
			}
		}
		if c.NFTTable == "" {
			return errors.New(`--nft-table "": must name a table (e.g. xlb)`)
		}
		for _, t := range []struct {
			flag string
			v    time.Duration
		}{
			{"ct-timeout-tcp", c.Timeouts.TCP}, {"ct-timeout-tcpfin", c.Timeouts.TCPFin},
			{"ct-timeout-udp", c.Timeouts.UDP}, {"ct-timeout-syn", c.Timeouts.SYN},
			{"ct-timeout-close", c.Timeouts.Close},
		} {
			if t.v < time.Second || t.v > 30*24*time.Hour {
				return fmt.Errorf("--%s %s: allowed values are 1s to 720h", t.flag, t.v)
			}
		}
	default:
		return fmt.Errorf("--dataplane %q: allowed values are %s", c.Plane, PlaneNames)
	}
	for _, n := range other {
		if changed(n) {
			return fmt.Errorf("--%s: only with --dataplane %s", n, map[string]string{"nft": "ebpf", "ebpf": "nft"}[c.Plane])
		}
	}
	return nil
}

// ParseSNATPorts parses --snat-ports: FIRST-LAST, 1024 <= FIRST <= LAST <=
// 65535 (ports below 1024 are the privileged ones).
func ParseSNATPorts(v string) (model.PortRange, error) {
	bad := fmt.Errorf("--snat-ports %q: must be FIRST-LAST with 1024 <= FIRST <= LAST <= 65535 (e.g. 20000-29999)", v)
	a, b, ok := strings.Cut(v, "-")
	if !ok {
		return model.PortRange{}, bad
	}
	first, err1 := strconv.ParseUint(a, 10, 16)
	last, err2 := strconv.ParseUint(b, 10, 16)
	if err1 != nil || err2 != nil || first < 1024 || first > last {
		return model.PortRange{}, bad
	}
	return model.PortRange{First: uint16(first), Last: uint16(last)}, nil
}

// Open opens the data plane the flags describe, in the current network
// namespace.
func Open(ctx context.Context, log *slog.Logger, c Flags) (dataplane.Dataplane, error) {
	switch c.Plane {
	case "nft":
		return openNFT(ctx, log, c)
	case "ebpf":
		xdp, err := ebpf.ParseXDPMode(c.XDP)
		if err != nil {
			return nil, err
		}
		p, err := ebpf.New(ctx, log, ebpf.Options{
			XDP:                xdp,
			Interfaces:         c.Interfaces,
			ConnTableSize:      2 * c.ConnTableSize, // two entries per connection
			PinPath:            c.PinPath,
			Timeouts:           c.Timeouts,
			BridgePortRedirect: c.BridgePortRedirect,
			SocketCgroup:       c.SocketCgroup,
			SNATPorts:          c.SNATPorts,
			PoliciesOnOutput:   c.PoliciesOnOutput,
		})
		if err != nil {
			return nil, err
		}
		log.Info("ebpf data plane attached", "interfaces", c.Interfaces, "pin_path", c.PinPath, "conn_table_size", c.ConnTableSize, "socket_lb_cgroup", c.SocketCgroup)
		return p, nil
	}
	return nil, fmt.Errorf("--dataplane %q: allowed values are %s", c.Plane, PlaneNames)
}

func openNFT(ctx context.Context, log *slog.Logger, c Flags) (dataplane.Dataplane, error) {
	opts := nft.Options{Table: c.NFTTable, Shards: c.NFTTables, NoCounters: !c.NFTCounters, SNATPorts: c.SNATPorts,
		PoliciesOnOutput: c.PoliciesOnOutput}
	if !c.ConnTableSet {
		// The kernel's conntrack limits stay as they are.
		p, err := nft.New(ctx, log, opts)
		if err != nil {
			return nil, err
		}
		return p, nil
	}
	limits := nft.ConntrackFor(c.ConnTableSize)
	// Before the tables exist if conntrack is loaded (a refusal then
	// leaves the kernel as it was); else once the NAT chains load it.
	err := nft.SetConntrack(netns.None(), limits)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	dp, oerr := nft.New(ctx, log, opts)
	if oerr != nil {
		return nil, oerr
	}
	if err != nil {
		if err := nft.SetConntrack(netns.None(), limits); err != nil {
			dp.Close()
			return nil, err
		}
	}
	log.Info("conntrack sized", "nf_conntrack_max", limits.Max, "nf_conntrack_buckets", limits.Buckets)
	return dp, nil
}
