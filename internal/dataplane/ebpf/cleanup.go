package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf/link"
)

// RemovePins removes everything a plane pinned under pinPath — its links
// (tcx, XDP and cgroup: unpinning the last reference detaches the
// program) and its maps (their memory is freed with the last reference) —
// and the directory itself, without loading or attaching anything. For
// `--cleanup` (uninstall), with no plane running on those pins (a running
// plane's descriptors would keep its programs attached until it exits).
// It returns what it removed; a pin path that does not exist or is not on
// a bpf file system has nothing to remove.
func RemovePins(pinPath string) ([]string, error) {
	entries, err := os.ReadDir(pinPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read pin path: %w", err)
	}
	if !isBPFFS(pinPath) {
		return nil, fmt.Errorf("pin path %q is not on a bpf file system", pinPath)
	}
	var gone []string
	var errs []error
	// Links first: the programs stop before their maps go.
	for _, links := range []bool{true, false} {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "link_") != links {
				continue
			}
			path := filepath.Join(pinPath, e.Name())
			if links {
				if l, err := link.LoadPinnedLink(path, nil); err == nil {
					err = l.Unpin()
					l.Close()
					if err != nil {
						errs = append(errs, fmt.Errorf("unpin %s: %w", path, err))
						continue
					}
					gone = append(gone, e.Name())
					continue
				}
			}
			if err := os.Remove(path); err != nil {
				errs = append(errs, fmt.Errorf("remove %s: %w", path, err))
				continue
			}
			gone = append(gone, e.Name())
		}
	}
	if len(errs) == 0 {
		if err := os.Remove(pinPath); err != nil {
			errs = append(errs, fmt.Errorf("remove pin path: %w", err))
		}
	}
	return gone, errors.Join(errs...)
}
