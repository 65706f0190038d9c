package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/nft"
)

// dataplaneNames are the values --dataplane accepts.
const dataplaneNames = "nft"

// openDataplane opens the data plane the daemon was asked for.
func openDataplane(ctx context.Context, log *slog.Logger, name string) (dataplane.Dataplane, error) {
	switch name {
	case "nft":
		// The current network namespace, table "xlb".
		p, err := nft.New(ctx, log, nft.Options{})
		if err != nil {
			return nil, err
		}
		return p, nil
	}
	return nil, fmt.Errorf("--dataplane %q: allowed values are %s", name, dataplaneNames)
}
