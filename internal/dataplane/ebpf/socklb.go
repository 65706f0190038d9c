package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Socket-level balancing (bpf/xlb_sock.c): cgroup v2 programs that send a
// connect() or sendmsg() to a service address straight to a backend, for
// what the node itself sends (the tc program sees only what arrives on an
// interface). On when Options.SocketCgroup names a cgroup v2 directory:
// every process in it or below is balanced at the socket, in the plane's
// network namespace.

// sockObjects are what the socket programs load: their programs and their
// own maps. The maps they share with the tc program are the plane's
// (sockShared); loading only this struct leaves the other maps of the
// object (it includes xlb_maps.h) unloaded.
type sockObjects struct {
	xlbSockPrograms
	XlbSockRev   *ebpf.Map `ebpf:"xlb_sock_rev"`
	XlbSockFwd   *ebpf.Map `ebpf:"xlb_sock_fwd"`
	XlbSockStats *ebpf.Map `ebpf:"xlb_sock_stats"`
}

func (o *sockObjects) Close() error {
	return errors.Join(o.xlbSockPrograms.Close(), closeMaps(o.XlbSockRev, o.XlbSockFwd, o.XlbSockStats))
}

func closeMaps(ms ...*ebpf.Map) error {
	var errs []error
	for _, m := range ms {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}

// sockMaps are the socket programs' own maps (pinned by name).
var sockMaps = []string{"xlb_sock_rev", "xlb_sock_fwd", "xlb_sock_stats"}

// sockShared are the plane's maps the socket programs read and write.
func (p *Plane) sockShared() map[string]*ebpf.Map {
	return map[string]*ebpf.Map{
		"xlb_services": p.objs.XlbServices, "xlb_slots": p.objs.XlbSlots, "xlb_backends": p.objs.XlbBackends,
		"xlb_rr": p.objs.XlbRr, "xlb_persist": p.objs.XlbPersist, "xlb_be_index": p.objs.XlbBeIndex,
		"xlb_stats": p.objs.XlbStats,
		// intra-connect off (xlb_svc_flags), static sessions (xlb_pick.h).
		"xlb_svc_flags": p.objs.XlbSvcFlags, "xlb_static": p.objs.XlbStatic,
		// The farms' policies (Options.PoliciesOnOutput).
		"xlb_tbl_conf": p.objs.XlbTblConf, "xlb_tbl_policy": p.objs.XlbTblPolicy, "xlb_tbl_meta": p.objs.XlbTblMeta,
		"xlb_tbl_steer": p.objs.XlbTblSteer, // farms chosen by source table (sourcetable.go)
		"xlb_tbl_addr4": p.objs.XlbTblAddr4, "xlb_tbl_addr6": p.objs.XlbTblAddr6, "xlb_tbl_hash": p.objs.XlbTblHash,
		"xlb_events": p.objs.XlbEvents, // policy drops' log
	}
}

// sockHooks are the programs and where each attaches.
func (o *sockObjects) hooks() []struct {
	name   string
	prog   *ebpf.Program
	attach ebpf.AttachType
} {
	return []struct {
		name   string
		prog   *ebpf.Program
		attach ebpf.AttachType
	}{
		{"connect4", o.XlbSockConnect4, ebpf.AttachCGroupInet4Connect},
		{"connect6", o.XlbSockConnect6, ebpf.AttachCGroupInet6Connect},
		{"sendmsg4", o.XlbSockSendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
		{"sendmsg6", o.XlbSockSendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
		{"recvmsg4", o.XlbSockRecvmsg4, ebpf.AttachCGroupUDP4Recvmsg},
		{"recvmsg6", o.XlbSockRecvmsg6, ebpf.AttachCGroupUDP6Recvmsg},
		{"getpeername4", o.XlbSockGetpeername4, ebpf.AttachCgroupInet4GetPeername},
		{"getpeername6", o.XlbSockGetpeername6, ebpf.AttachCgroupInet6GetPeername},
	}
}

const sockLinkPrefix = "link_cgroup_"

// CheckCgroup checks that dir is a cgroup v2 directory (--socket-lb-cgroup).
func CheckCgroup(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("--socket-lb-cgroup %q: %w", dir, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return fmt.Errorf("--socket-lb-cgroup %q: not a cgroup v2 directory (mount -t cgroup2 none DIR; on hosts with cgroup v2, /sys/fs/cgroup)", dir)
	}
	return nil
}

// netnsCookie is the kernel's cookie of the plane's network namespace
// (SO_NETNS_COOKIE), what bpf_get_netns_cookie answers there.
func (p *Plane) netnsCookie() (uint64, error) {
	var cookie uint64
	err := p.inNS(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("network namespace cookie: %w", err)
	}
	return cookie, nil
}

// attachSockets loads the socket programs and attaches them to
// Options.SocketCgroup; pinned links of an earlier run get the new
// programs in place (no connect() goes unbalanced during a restart).
// Without SocketCgroup it removes the links an earlier run left.
func (p *Plane) attachSockets() error {
	dir := p.opts.SocketCgroup
	if dir == "" {
		p.detachSockets()
		return nil
	}
	if err := CheckCgroup(dir); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("socket-lb cgroup %q: %w", dir, err)
	}
	cgroupID := st.Ino // a cgroup v2 directory's inode number is its cgroup id
	spec, err := loadXlbSock()
	if err != nil {
		return fmt.Errorf("load socket programs spec: %w", err)
	}
	cookie, err := p.netnsCookie()
	if err != nil {
		return err
	}
	if err := spec.Variables["xlb_sock_netns"].Set(cookie); err != nil {
		return fmt.Errorf("set xlb_sock_netns: %w", err)
	}
	if p.opts.PoliciesOnOutput {
		if err := spec.Variables["xlb_sock_policies"].Set(uint8(1)); err != nil {
			return fmt.Errorf("set xlb_sock_policies: %w", err)
		}
	}
	if err := p.replaceStalePins(spec, sockMaps); err != nil {
		return err
	}
	var objs sockObjects
	err = spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{
		Maps:            ebpf.MapOptions{PinPath: p.opts.PinPath},
		MapReplacements: p.sockShared(),
	})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return fmt.Errorf("load socket programs: %+v", ve)
		}
		return fmt.Errorf("load socket programs: %w", err)
	}
	p.sock = &objs
	for _, h := range objs.hooks() {
		path := filepath.Join(p.opts.PinPath, sockLinkPrefix+h.name)
		if l, err := link.LoadPinnedLink(path, nil); err == nil {
			info, ierr := l.Info()
			if ierr == nil && info.Cgroup() != nil && info.Cgroup().CgroupId == cgroupID {
				if err := l.Update(h.prog); err != nil {
					l.Close()
					return fmt.Errorf("update %s program: %w", h.name, err)
				}
				p.sockLinks = append(p.sockLinks, l)
				continue
			}
			// Another cgroup (the flag changed): detach from it.
			_ = l.Unpin()
			l.Close()
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: dir, Attach: h.attach, Program: h.prog})
		if err != nil {
			return fmt.Errorf("attach %s to cgroup %q: %w", h.name, dir, err)
		}
		if err := l.Pin(path); err != nil {
			l.Close()
			return fmt.Errorf("pin %s link: %w", h.name, err)
		}
		p.sockLinks = append(p.sockLinks, l)
	}
	p.log.Info("socket-level balancing attached", "cgroup", dir)
	return nil
}

// detachSockets removes the pinned socket links (detaching the programs)
// and the socket programs' pinned maps.
func (p *Plane) detachSockets() {
	entries, _ := os.ReadDir(p.opts.PinPath)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), sockLinkPrefix) {
			continue
		}
		path := filepath.Join(p.opts.PinPath, e.Name())
		if l, err := link.LoadPinnedLink(path, nil); err == nil {
			_ = l.Unpin()
			l.Close()
		} else {
			_ = os.Remove(path)
		}
		p.log.Info("detached socket-level balancing", "pin", e.Name())
	}
	for _, n := range sockMaps {
		_ = os.Remove(filepath.Join(p.opts.PinPath, n))
	}
}

// closeSockets releases the socket programs' descriptors; their links stay
// pinned (and attached).
func (p *Plane) closeSockets() error {
	for _, l := range p.sockLinks {
		l.Close()
	}
	p.sockLinks = nil
	if p.sock == nil {
		return nil
	}
	err := p.sock.Close()
	p.sock = nil
	return err
}

// SockStats returns the socket programs' counters summed over CPUs, by
// name; nil when socket-level balancing is off.
func (p *Plane) SockStats() (map[string]uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sock == nil {
		return nil, nil
	}
	names := map[xlbSockXlbSockStat]string{
		xlbSockXlbSockStatXLB_SOCK_STAT_XLATE: "xlate", xlbSockXlbSockStatXLB_SOCK_STAT_REFUSED: "refused",
		xlbSockXlbSockStatXLB_SOCK_STAT_STICKY: "sticky", xlbSockXlbSockStatXLB_SOCK_STAT_REV: "rev",
		xlbSockXlbSockStatXLB_SOCK_STAT_OTHER_NETNS: "other_netns", xlbSockXlbSockStatXLB_SOCK_STAT_DENIED: "denied",
	}
	out := map[string]uint64{}
	for i, name := range names {
		var per []uint64
		if err := p.sock.XlbSockStats.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("read socket counter %s: %w", name, err)
		}
		for _, v := range per {
			out[name] += v
		}
	}
	return out, nil
}

// replaceStalePins removes the pins among names whose map no longer
// matches spec (a new version changed it): loading then creates it anew.
func (p *Plane) replaceStalePins(spec *ebpf.CollectionSpec, names []string) error {
	for _, name := range names {
		ms := spec.Maps[name]
		if ms == nil {
			return fmt.Errorf("map %s not in the program", name)
		}
		path := filepath.Join(p.opts.PinPath, name)
		m, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err == nil {
			err = ms.Compatible(m)
			m.Close()
			if err == nil {
				continue
			}
		}
		p.log.Warn("pinned map differs from this version; replacing it", "map", name, "err", err)
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("remove pinned map %s: %w", path, err)
		}
	}
	return nil
}
