package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

// dataplaneNames are the values --dataplane accepts.
const dataplaneNames = "nft"

// openDataplane opens the data plane the daemon was asked for.
func openDataplane(ctx context.Context, log *slog.Logger, name string) (dataplane.Dataplane, error) {
	switch name {
	case "nft":
		// The nft data plane (internal/dataplane/nft) is wired here once it lands:
		//	return nft.New(ctx, log, nft.Options{})
		return nil, errors.New("the nft data plane is not built into this binary yet")
	}
	return nil, fmt.Errorf("--dataplane %q: allowed values are %s", name, dataplaneNames)
}
