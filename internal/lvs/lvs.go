package lvs

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/xlb-lb/xlb/internal/model"
)

// Result is what an LVS configuration gives xlb.
type Result struct {
	Farms []model.Farm
	// Notes name what was read and has no effect in xlb (keepalived's
	// VRRP, notify scripts, mail alerts, ...), one line each.
	Notes []string
}

func (r *Result) note(n *Node, what string) { r.notef(n.Where()+": "+n.Key, what) }

// notef notes what about the setting where names ("FILE:LINE: keyword").
func (r *Result) notef(where, what string) {
	r.Notes = append(r.Notes, where+": "+what)
}

// farmName names the farm of a virtual server: vs_ADDR_PORT[_udp|_sctp]
// (":" of an IPv6 address as "-"), fwm_MARK for a firewall mark.
func farmName(addr netip.Addr, port uint16, mark uint32, proto model.Protocol) string {
	var s string
	if mark != 0 {
		s = fmt.Sprintf("fwm_%d", mark)
	} else {
		s = "vs_" + strings.ReplaceAll(addr.String(), ":", "-") + "_" + strconv.Itoa(int(port))
	}
	if proto != model.ProtoTCP && mark == 0 {
		s += "_" + proto.String()
	}
	return s
}

// setSched maps IPVS's schedulers to xlb's: those xlb has under another
// name, and a refusal for those it has not. what names the setting in
// errors ("FILE:LINE: lb_algo").
func setSched(f *model.Farm, s, what string) error {
	switch s {
	case "rr":
		f.Scheduler = model.SchedRR
	case "wrr":
		f.Scheduler = model.SchedWeight
	case "lc":
		f.Scheduler = model.SchedLC
	case "wlc":
		f.Scheduler = model.SchedWLC
	case "sh":
		f.Scheduler, f.SchedParam = model.SchedHash, f.SchedParam|model.KeySrcIP
	case "dh":
		f.Scheduler, f.SchedParam = model.SchedHash, f.SchedParam|model.KeyDstIP
	case "mh":
		f.Scheduler = model.SchedMaglev
	default:
		return fmt.Errorf("%s %s: xlb has no such scheduler (it has rr, wrr as weight, lc, wlc, sh and dh as hash, mh as maglev)", what, s)
	}
	return nil
}

// finishSched applies IPVS's sh-port or mh-port flag (port) once the
// scheduler is known, and notes how maglev differs from IPVS's mh; where
// names the service.
func finishSched(f *model.Farm, port bool, where string, res *Result) {
	switch {
	case f.Scheduler == model.SchedHash && f.SchedParam&model.KeySrcIP != 0:
		if port {
			f.SchedParam |= model.KeySrcPort
		}
	case f.Scheduler == model.SchedMaglev:
		res.notef(where, "mh imported as maglev, which hashes both addresses and both ports where IPVS's mh hashes the client's address (and port with mh-port): one client's connections may reach different backends; persistence keeps them on one")
	case port:
		res.notef(where, "sh-port/mh-port: no effect with this scheduler")
	}
}

// setMethod maps IPVS's forwarding methods (NAT, DR, TUN) to xlb's modes.
func setMethod(f *model.Farm, m, what string) error {
	switch strings.ToUpper(m) {
	case "NAT":
		f.Mode = model.ModeDNAT
	case "DR":
		f.Mode = model.ModeDSR
	case "TUN":
		return fmt.Errorf("%s TUN: xlb does not tunnel to backends (it has NAT as dnat and DR as dsr)", what)
	default:
		return fmt.Errorf("%s %q: want NAT or DR", what, m)
	}
	return nil
}

// ReplaceLeastConn gives the farms that schedule by lc or wlc (wlc is
// keepalived's and ipvsadm's default) the IPVS scheduler sched instead,
// for the nft plane, which does not build least-connection scheduling
// (docs/dataplane-nft.md); "" keeps them and notes where they would be
// refused.
func (r *Result) ReplaceLeastConn(sched string) error {
	for i := range r.Farms {
		f := &r.Farms[i]
		if f.Scheduler != model.SchedLC && f.Scheduler != model.SchedWLC {
			continue
		}
		was := f.Scheduler
		if sched == "" {
			r.notef("farm "+f.Name, "scheduler "+was.String()+" is built on the eBPF data plane; the nft data plane refuses it at restore (--lc-as wrr replaces it)")
			continue
		}
		if err := setSched(f, sched, "--lc-as"); err != nil {
			return err
		}
		if f.Scheduler == model.SchedLC || f.Scheduler == model.SchedWLC {
			return fmt.Errorf("--lc-as %s: name a scheduler other than lc and wlc", sched)
		}
		r.notef("farm "+f.Name, "scheduler "+was.String()+" replaced by "+f.Scheduler.String()+" (--lc-as)")
	}
	return nil
}
