package setup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane/ebpf"
	"github.com/xlb-lb/xlb/internal/dataplane/nft"
)

// What xlb puts in the kernel, and how it is taken out: both binaries
// (the daemon and the kube-proxy) share this, each with its own names
// (Defaults: tables xlb* and pins under /sys/fs/bpf/xlb for the daemon,
// xlb-kube* and /sys/fs/bpf/xlb-kube for the proxy), so one never
// removes the other's.
//
//   - Cleanup (--cleanup) removes both planes' objects and exits: the
//     farms' nft tables of any --nft-tables layout (inet and netdev), the
//     named tables' table, and every pin under --pin-path (links detached
//     first, then maps).
//   - RemoveOtherPlane runs at every start, once the plane in use has
//     loaded every farm: the other plane's objects only ever serve stale
//     farms (an eBPF program left attached keeps balancing farms deleted
//     since the switch to nft), so they are removed, and each is logged.
//
// xlb programs still attached in the namespace after that are held by
// another pin path or a running process (another xlb: the kube-proxy, or
// a daemon with another --pin-path); they are named in a warning, not
// removed.

// Cleanup removes every object of xlb's under the flags' names (both
// planes') from the current network namespace, and returns what it
// removed and the xlb programs that are still attached.
func Cleanup(ctx context.Context, c Flags) (removed, left []string, err error) {
	tables, terr := nft.RemoveTables(ctx, netns.None(), c.NFTTable)
	pins, perr := removePins(ctx, c.PinPath)
	removed = append(tables, pins...)
	left, lerr := ebpf.AttachedPrograms(netns.None())
	return removed, left, errors.Join(terr, perr, lerr)
}

// RemoveOtherPlane removes the objects of the plane c does not use from
// the current network namespace, and logs each.
func RemoveOtherPlane(ctx context.Context, log *slog.Logger, c Flags) error {
	var (
		removed []string
		err     error
	)
	switch c.Plane {
	case "nft":
		removed, err = removePins(ctx, c.PinPath)
		if left, lerr := ebpf.AttachedPrograms(netns.None()); lerr == nil && len(left) > 0 {
			log.Warn("xlb eBPF programs are still attached in this namespace, held by another pin path or process (another xlb?); "+
				"remove them with `xlb daemon --cleanup --pin-path DIR` or bpftool if they are not in use", "programs", left)
		}
	case "ebpf":
		removed, err = nft.RemoveTables(ctx, netns.None(), c.NFTTable)
	}
	if len(removed) > 0 {
		log.Warn("removed the other data plane's objects left in the kernel (a plane switch): they served stale farms", "dataplane", c.Plane, "removed", removed)
	}
	return err
}

// removePins is ebpf.RemovePins, once bpffs is there to look at.
func removePins(ctx context.Context, pinPath string) ([]string, error) {
	if pinPath == "" {
		return nil, nil
	}
	return ebpf.RemovePins(ctx, pinPath)
}

// Report prints what a Cleanup removed and what it left attached, one line
// each, for --cleanup of either binary; it returns err with the flag
// named.
func Report(w io.Writer, removed, left []string, err error) error {
	for _, r := range removed {
		fmt.Fprintf(w, "removed %s\n", r)
	}
	for _, l := range left {
		fmt.Fprintf(w, "still attached (held by another pin path or process): %s\n", l)
	}
	if len(removed) == 0 && err == nil {
		fmt.Fprintln(w, "nothing of xlb's in the kernel")
	}
	if err != nil {
		return fmt.Errorf("--cleanup: %w", err)
	}
	return nil
}
