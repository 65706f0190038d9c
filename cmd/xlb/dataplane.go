package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/ebpf"
	"github.com/xlb-lb/xlb/internal/dataplane/nft"
)

// dataplaneNames are the values --dataplane accepts.
const dataplaneNames = "nft, ebpf"

// dataplaneConfig is what the daemon's flags say about the data plane.
type dataplaneConfig struct {
	name string
	// nft only.
	nftTables int // farms are spread over this many tables (1: one table "xlb")
	// Both: tracked connections (ebpf: two entries each in its LRU; nft:
	// the kernel's nf_conntrack_max, only when connTableSet).
	connTableSize int
	connTableSet  bool
	// ebpf only.
	interfaces []string // empty: every interface but loopback
	pinPath    string
	xdp        string // off, generic, native
	timeouts   ebpf.Timeouts
	// bridgePortRedirect: ebpf.Options.BridgePortRedirect.
	bridgePortRedirect bool
}

// openDataplane opens the data plane the daemon was asked for.
func openDataplane(ctx context.Context, log *slog.Logger, c dataplaneConfig) (dataplane.Dataplane, error) {
	switch c.name {
	case "nft":
		// The current network namespace; tables "xlb-00", "xlb-01", ...
		// (or one table "xlb" with --nft-tables 1).
		if !c.connTableSet {
			// The kernel's conntrack limits stay as they are.
			return nft.Open(ctx, log, nft.Options{Shards: c.nftTables})
		}
		limits := nft.ConntrackFor(c.connTableSize)
		// Before the tables exist if conntrack is loaded (a refusal then
		// leaves the kernel as it was); else once the NAT chains load it.
		err := nft.SetConntrack(netns.None(), limits)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		dp, oerr := nft.Open(ctx, log, nft.Options{Shards: c.nftTables})
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
	case "ebpf":
		xdp, err := ebpf.ParseXDPMode(c.xdp)
		if err != nil {
			return nil, err
		}
		// The current network namespace.
		p, err := ebpf.New(ctx, log, ebpf.Options{
			XDP:           xdp,
			Interfaces:    c.interfaces,
			ConnTableSize: 2 * c.connTableSize,
			PinPath:       c.pinPath,
			Timeouts:      c.timeouts,

			BridgePortRedirect: c.bridgePortRedirect,
		})
		if err != nil {
			return nil, err
		}
		return p, nil
	}
	return nil, fmt.Errorf("--dataplane %q: allowed values are %s", c.name, dataplaneNames)
}
