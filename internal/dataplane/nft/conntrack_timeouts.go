package nft

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/nsenter"
)

// ConntrackTimeouts are the netfilter conntrack settings kube-proxy sets
// (its conntrack section): zero durations (and false) leave a value as
// the kernel has it.
type ConntrackTimeouts struct {
	TCPEstablished, TCPCloseWait, UDP, UDPStream time.Duration
	TCPBeLiberal                                 bool
}

// SetConntrackTimeouts writes t's non-zero values to the conntrack
// sysctls of namespace ns (netns.None(): the caller's), as kube-proxy does.
// The error names the sysctl and the value.
func SetConntrackTimeouts(ns netns.NsHandle, t ConntrackTimeouts) error {
	type sysctl struct {
		name string
		d    time.Duration // whole seconds; 0: leave
	}
	set := []sysctl{{"nf_conntrack_tcp_timeout_established", t.TCPEstablished}, {"nf_conntrack_tcp_timeout_close_wait", t.TCPCloseWait},
		{"nf_conntrack_udp_timeout", t.UDP}, {"nf_conntrack_udp_timeout_stream", t.UDPStream}}
	if t.TCPBeLiberal {
		set = append(set, sysctl{"nf_conntrack_tcp_be_liberal", time.Second}) // the value 1
	}
	return nsenter.Run(ns, func() error {
		for _, s := range set {
			if s.d <= 0 {
				continue
			}
			v := strconv.Itoa(int(s.d / time.Second))
			if err := os.WriteFile("/proc/sys/net/netfilter/"+s.name, []byte(v), 0); err != nil {
				return fmt.Errorf("set net.netfilter.%s to %s: %w", s.name, v, err)
			}
		}
		return nil
	})
}
