package setup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane/ebpf"
	"github.com/xlb-lb/xlb/internal/dataplane/nft"
)

// Cleanup removes every kernel object the data plane flags name, for both
// planes whatever --dataplane says (a node that switched planes has the
// other's left over): the nft plane's tables (--nft-table, any
// --nft-tables layout, and its named tables' table) and the eBPF plane's
// pins under --pin-path (links, which detaches its tcx, XDP and socket
// programs, and maps). Nothing else is touched. It is `--cleanup`: run it
// with the daemon or proxy stopped. Saved state on disk is kept.
func Cleanup(ctx context.Context, log *slog.Logger, c Flags) error {
	var errs []error
	tables, err := nft.RemoveTables(netns.None(), c.NFTTable)
	if err != nil {
		errs = append(errs, fmt.Errorf("nft: %w", err))
	}
	log.Info("cleanup: nftables tables removed", "prefix", c.NFTTable, "tables", fmt.Sprint(tables))
	pins, err := ebpf.RemovePins(c.PinPath)
	if err != nil {
		errs = append(errs, fmt.Errorf("ebpf: %w", err))
	}
	log.Info("cleanup: eBPF pins removed", "pin_path", c.PinPath, "pins", len(pins))
	return errors.Join(errs...)
}
