package main

import (
	"context"
	"fmt"
	"log/slog"

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
	// ebpf only.
	interfaces    []string // empty: every interface but loopback
	connTableSize int      // tracked connections (two conntrack entries each)
	pinPath       string
	xdp           string // off, generic, native
	timeouts      ebpf.Timeouts
}

// openDataplane opens the data plane the daemon was asked for.
func openDataplane(ctx context.Context, log *slog.Logger, c dataplaneConfig) (dataplane.Dataplane, error) {
	switch c.name {
	case "nft":
		// The current network namespace; tables "xlb-00", "xlb-01", ...
		// (or one table "xlb" with --nft-tables 1).
		return nft.Open(ctx, log, nft.Options{Shards: c.nftTables})
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
		})
		if err != nil {
			return nil, err
		}
		return p, nil
	}
	return nil, fmt.Errorf("--dataplane %q: allowed values are %s", c.name, dataplaneNames)
}
