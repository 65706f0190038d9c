package ebpf

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/nsenter"
)

// RemovePins removes what the eBPF plane pinned under pinPath: each
// pinned link is detached (so the program stops at once, even while
// another process holds the link) and unpinned, each pinned map
// unpinned (the kernel frees it with its last reference), then the
// directory if it is empty. It returns what it removed ("link
// link_ingress_eth0 (detached)", "map xlb_services"). A pin path that
// does not exist, or is not on a bpf file system, holds nothing of xlb's.
// `xlb daemon --cleanup` and a daemon that starts on the nft plane call
// it.
func RemovePins(ctx context.Context, pinPath string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(pinPath)
	if errors.Is(err, os.ErrNotExist) || err == nil && !isBPFFS(pinPath) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read pin path %s: %w", pinPath, err)
	}
	var gone []string
	var errs []error
	// Links first: the program stops before its maps go.
	for _, pass := range []bool{true, false} {
		for _, e := range entries {
			path := filepath.Join(pinPath, e.Name())
			isLink := strings.HasPrefix(e.Name(), "link_")
			if isLink != pass {
				continue
			}
			if isLink {
				l, err := link.LoadPinnedLink(path, nil)
				if err != nil {
					errs = append(errs, fmt.Errorf("load pinned link %s: %w", path, err))
					continue
				}
				derr := l.Detach()
				if err := l.Unpin(); err != nil {
					errs = append(errs, fmt.Errorf("unpin link %s: %w", path, err))
				}
				l.Close()
				what := "link " + e.Name()
				if derr == nil {
					what += " (detached)"
				}
				gone = append(gone, what)
				continue
			}
			if err := os.Remove(path); err != nil {
				errs = append(errs, fmt.Errorf("unpin %s: %w", path, err))
				continue
			}
			gone = append(gone, "map "+e.Name())
		}
	}
	if len(errs) == 0 {
		_ = os.Remove(pinPath) // only if empty
	}
	return gone, errors.Join(errs...)
}

// AttachedPrograms lists xlb's programs (named xlb_*) attached at tcx
// ingress or as XDP to the interfaces of namespace ns (netns.None(): the
// current one): "tcx program xlb_ingress (id 42, link 7) on eth0". After
// RemovePins, what is left there is held by another pin path (the
// kube-proxy's, a daemon's with another --pin-path) or by a running
// process; it is reported, not removed, since it may be another xlb's.
func AttachedPrograms(ns netns.NsHandle) ([]string, error) {
	var out []string
	err := nsenter.Run(ns, func() error {
		h, err := netlink.NewHandle()
		if err != nil {
			return err
		}
		defer h.Close()
		links, err := h.LinkList()
		if err != nil {
			return fmt.Errorf("list interfaces: %w", err)
		}
		for _, l := range links {
			a := l.Attrs()
			res, err := link.QueryPrograms(link.QueryOptions{Target: a.Index, Attach: ebpf.AttachTCXIngress})
			if err == nil {
				for _, p := range res.Programs {
					if name := progName(p.ID); strings.HasPrefix(name, "xlb_") {
						lid, _ := p.LinkID()
						out = append(out, fmt.Sprintf("tcx program %s (id %d, link %d) on %s", name, p.ID, lid, a.Name))
					}
				}
			}
			if a.Xdp != nil && a.Xdp.Attached {
				if name := progName(ebpf.ProgramID(a.Xdp.ProgId)); strings.HasPrefix(name, "xlb_") {
					out = append(out, fmt.Sprintf("xdp program %s (id %d) on %s", name, a.Xdp.ProgId, a.Name))
				}
			}
		}
		return nil
	})
	return out, err
}

func progName(id ebpf.ProgramID) string {
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return ""
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return ""
	}
	return info.Name
}
