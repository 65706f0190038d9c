package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// XDPMode says whether and how the XDP fast path (xlb_xdp) is attached.
type XDPMode string

// XDP modes.
const (
	// XDPOff: no XDP program; the tcx program does everything.
	XDPOff XDPMode = "off"
	// XDPGeneric: the XDP program runs on skbs (any driver). Its redirects
	// work to any interface; it saves little, since the skb exists.
	XDPGeneric XDPMode = "generic"
	// XDPNative: the XDP program runs in the driver before an skb is built
	// (physical NICs with XDP support; veth). It redirects only to the
	// interfaces it is attached to (their drivers transmit XDP frames);
	// other next hops take the tcx path.
	XDPNative XDPMode = "native"
)

// ParseXDPMode parses --xdp.
func ParseXDPMode(s string) (XDPMode, error) {
	switch m := XDPMode(s); m {
	case XDPOff, XDPGeneric, XDPNative:
		return m, nil
	case "":
		return XDPOff, nil
	}
	return "", fmt.Errorf("--xdp %q: allowed values are off, generic, native", s)
}

func xdpLinkPin(pinPath string, mode XDPMode, ifname string) string {
	return filepath.Join(pinPath, "link_xdp_"+string(mode)+"_"+ifname)
}

// attachXDP attaches the XDP fast path to the interfaces in the configured
// mode, or not at all. A pinned link of an earlier run in the same mode
// gets the new program in place; pinned links of another mode, or of
// interfaces no longer wanted, are removed (detaching them: their packets
// take the tcx path meanwhile, nothing is lost).
func (p *Plane) attachXDP(ifaces map[string]int) error {
	mode := p.opts.XDP
	want := map[string]bool{}
	if mode != XDPOff {
		// Stale entries (interfaces of an earlier run) go first.
		var k, v uint32
		var stale []uint32
		it := p.objs.XlbXdpTx.Iterate()
		for it.Next(&k, &v) {
			stale = append(stale, k)
		}
		for _, k := range stale {
			_ = p.objs.XlbXdpTx.Delete(k)
		}
		for name, idx := range ifaces {
			want[filepath.Base(xdpLinkPin(p.opts.PinPath, mode, name))] = true
			if err := p.attachXDPOne(name, idx); err != nil {
				return err
			}
		}
	}
	entries, err := os.ReadDir(p.opts.PinPath)
	if err != nil {
		return fmt.Errorf("read pin path: %w", err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "link_xdp_") || want[e.Name()] {
			continue
		}
		path := filepath.Join(p.opts.PinPath, e.Name())
		if l, err := link.LoadPinnedLink(path, nil); err == nil {
			_ = l.Unpin()
			l.Close()
		} else if !errors.Is(err, os.ErrNotExist) {
			_ = os.Remove(path)
		}
		p.log.Info("detached xdp program", "pin", e.Name())
	}
	return nil
}

// attachXDPOne attaches the XDP fast path to interface name (index idx) in
// the configured mode (nothing when off), or gives its pinned link of an
// earlier run the program, and lets the program redirect there.
func (p *Plane) attachXDPOne(name string, idx int) error {
	mode := p.opts.XDP
	if mode == XDPOff || mode == "" {
		return nil
	}
	flags := link.XDPGenericMode
	if mode == XDPNative {
		flags = link.XDPDriverMode
	}
	path := xdpLinkPin(p.opts.PinPath, mode, name)
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		info, ierr := l.Info()
		if ierr == nil && info.XDP() != nil && int(info.XDP().Ifindex) == idx {
			if err := l.Update(p.objs.XlbXdp); err != nil {
				l.Close()
				return fmt.Errorf("update xdp program of %s: %w", name, err)
			}
			p.xdpLinks[name] = l
		} else {
			_ = l.Unpin()
			l.Close()
		}
	}
	if p.xdpLinks[name] == nil {
		var l link.Link
		err := p.inNS(func() error {
			var err error
			l, err = link.AttachXDP(link.XDPOptions{Program: p.objs.XlbXdp, Interface: idx, Flags: flags})
			return err
		})
		if err != nil {
			return fmt.Errorf("attach xdp (%s) to %q: %w", mode, name, err)
		}
		if err := l.Pin(path); err != nil {
			l.Close()
			return fmt.Errorf("pin xdp link of %q: %w", name, err)
		}
		p.xdpLinks[name] = l
	}
	if err := p.objs.XlbXdpTx.Update(uint32(idx), uint32(1), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write xdp interfaces: %w", err)
	}
	return nil
}

// detachXDPOne removes the XDP link of interface name, if any, and its
// entry in xlb_xdp_tx.
func (p *Plane) detachXDPOne(name string) {
	l := p.xdpLinks[name]
	if l == nil {
		return
	}
	if info, err := l.Info(); err == nil && info.XDP() != nil {
		_ = p.objs.XlbXdpTx.Delete(info.XDP().Ifindex)
	}
	_ = l.Unpin()
	l.Close()
	delete(p.xdpLinks, name)
}
