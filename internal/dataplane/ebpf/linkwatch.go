package ebpf

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Interfaces come and go while the plane runs (a Pod's veth is created
// when the Pod starts): the link watch (startPeerTxWatch) calls syncLinks on
// every link change, which attaches the program to each new interface the
// selection takes and drops the links of interfaces that are gone.

// isPattern reports whether an Options.Interfaces entry is a shell pattern
// (path.Match: veth*, lxc?, eth[0-3]) rather than a name.
func isPattern(s string) bool { return strings.ContainsAny(s, `*?[\`) }

// ValidateInterfaces checks the entries of Options.Interfaces: names or
// path.Match patterns.
func ValidateInterfaces(names []string) error {
	for _, n := range names {
		if n == "" {
			return fmt.Errorf("--interfaces %q: an empty interface name", strings.Join(names, ","))
		}
		if _, err := path.Match(n, ""); err != nil {
			return fmt.Errorf("--interfaces %q: %q is not a valid pattern (shell patterns such as veth* or eth[0-3]): %w", strings.Join(names, ","), n, err)
		}
	}
	return nil
}

// selects reports whether the program belongs on interface a: every
// interface but loopback when Options.Interfaces is empty, else those whose
// name is listed or matches a listed pattern.
func (p *Plane) selects(a *netlink.LinkAttrs) bool {
	if len(p.opts.Interfaces) == 0 {
		return a.Flags&unix.IFF_LOOPBACK == 0 && a.Name != "lo"
	}
	for _, n := range p.opts.Interfaces {
		if n == a.Name {
			return true
		}
		if ok, _ := path.Match(n, a.Name); ok && isPattern(n) {
			return true
		}
	}
	return false
}

// syncLinks attaches the program to the selected interfaces that have no
// link yet (created since the last look, or recreated under the same name)
// and drops the links of interfaces no longer in the namespace (deleted,
// renamed, moved to another namespace). p.mu must be held.
func (p *Plane) syncLinks(links []netlink.Link) error {
	now := map[string]int{}
	for _, l := range links {
		if a := l.Attrs(); p.selects(a) {
			now[a.Name] = a.Index
		}
	}
	for name, l := range p.links {
		idx, ok := now[name]
		if ok {
			info, err := l.Info()
			ok = err == nil && info.TCX() != nil && int(info.TCX().Ifindex) == idx
		}
		if !ok {
			p.detachTCX(name)
			p.detachXDPOne(name)
			p.log.Info("detached from interface gone from the namespace", "interface", name)
		}
	}
	var errs []error
	for name, idx := range now {
		if p.links[name] != nil {
			continue
		}
		if err := p.attachTCX(name, idx); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := p.attachXDPOne(name, idx); err != nil {
			errs = append(errs, err)
		}
		p.log.Info("attached to new interface", "interface", name, "ifindex", idx)
	}
	if len(errs) > 0 {
		return fmt.Errorf("attach to new interfaces: %v", errs)
	}
	return nil
}

// linksChanged brings xlb_host_mac, the links, xlb_peer_tx and the iface
// tables' hashes in line with the namespace's interfaces. p.mu must be held.
func (p *Plane) linksChanged() error {
	links, err := p.nl.LinkList()
	if err != nil {
		return fmt.Errorf("list interfaces: %w", err)
	}
	return errors.Join(p.writeHostMACs(links), p.syncLinks(links), p.writePeerTx(), p.syncIfaceTables(links))
}
