package conformance

import (
	"encoding/binary"
	"hash/crc32"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// SCTP is checked on the conntrack side only: this kernel has no SCTP
// sockets (socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) fails with
// EPROTONOSUPPORT), but conntrack and NAT handle SCTP without them. The
// client sends a real SCTP INIT (valid CRC32c, which conntrack checks) from
// a raw socket; a raw socket on each backend sees what arrives.

const ipprotoSCTP = 132

// sctpInit is an SCTP packet with one INIT chunk from srcPort to dstPort.
func sctpInit(srcPort, dstPort uint16, tag uint32) []byte {
	p := make([]byte, 12, 32)
	binary.BigEndian.PutUint16(p[0:], srcPort)
	binary.BigEndian.PutUint16(p[2:], dstPort)
	// Verification tag 0 in a packet carrying INIT (RFC 9260 8.5.1).
	chunk := []byte{1, 0, 0, 20}                        // type INIT, flags, length 20
	chunk = binary.BigEndian.AppendUint32(chunk, tag)   // initiate tag
	chunk = binary.BigEndian.AppendUint32(chunk, 65536) // a_rwnd
	chunk = binary.BigEndian.AppendUint16(chunk, 1)     // outbound streams
	chunk = binary.BigEndian.AppendUint16(chunk, 1)     // inbound streams
	chunk = binary.BigEndian.AppendUint32(chunk, tag+1) // initial TSN
	p = append(p, chunk...)
	// CRC32c over the packet with a zero checksum field, stored least
	// significant byte first (RFC 9260 appendix A).
	binary.LittleEndian.PutUint32(p[8:], crc32.Checksum(p, crc32.MakeTable(crc32.Castagnoli)))
	return p
}

// sctpSniffer reads SCTP packets arriving in a backend's namespace.
type sctpSniffer struct {
	name string
	fd   int
}

func newSCTPSniffer(t *testing.T, b testutil.Host, name string) *sctpSniffer {
	var fd int
	if err := testutil.Do(b.NS, func() error {
		var err error
		fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, ipprotoSCTP)
		return err
	}); err != nil {
		t.Fatalf("raw SCTP socket on %s: %v", name, err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	tv := syscall.NsecToTimeval(int64(100 * time.Millisecond))
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv)
	return &sctpSniffer{name: name, fd: fd}
}

// seen returns the destination address and port of the INITs that arrived,
// by initiate tag, reading until nothing more comes.
func (s *sctpSniffer) seen() map[uint32][]netip.AddrPort {
	out := map[uint32][]netip.AddrPort{}
	buf := make([]byte, 2048)
	for {
		n, _, err := syscall.Recvfrom(s.fd, buf, 0)
		if err != nil {
			return out
		}
		ihl := int(buf[0]&0x0f) * 4
		if n < ihl+24 || buf[ihl+12] != 1 {
			continue
		}
		tag := binary.BigEndian.Uint32(buf[ihl+16:])
		dst := netip.AddrFrom4([4]byte(buf[16:20]))
		out[tag] = append(out[tag], netip.AddrPortFrom(dst, binary.BigEndian.Uint16(buf[ihl+2:])))
	}
}

// runSCTP: SCTP INITs to the VIP are balanced over the backends, arrive
// with the backend's address and port, and conntrack tracks them as SCTP
// associations of the farm.
func runSCTP(t *testing.T, e *Env, f model.Farm) {
	sniffers := make([]*sctpSniffer, len(e.Backends))
	for i, b := range e.Backends {
		sniffers[i] = newSCTPSniffer(t, b, f.Backends[i].Name)
	}
	e.Put(t, f)
	var raw int
	if err := testutil.Do(e.Client.NS, func() error {
		var err error
		raw, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, ipprotoSCTP)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(raw)
	vip := f.VirtualAddr.As4()
	const flows = 6
	for i := range flows {
		pkt := sctpInit(uint16(40000+i), f.VirtualPorts[0].First, 0x5c7f0000+uint32(i))
		if err := syscall.Sendto(raw, pkt, 0, &syscall.SockaddrInet4{Addr: vip}); err != nil {
			t.Fatalf("send SCTP INIT: %v", err)
		}
	}
	got := map[string]int{}
	for j, s := range sniffers {
		for tag, dsts := range s.seen() {
			i := tag - 0x5c7f0000
			if i >= flows {
				continue
			}
			for _, dst := range dsts {
				want := netip.AddrPortFrom(f.Backends[j].Addr, f.Backends[j].Port)
				if dst != want {
					t.Errorf("INIT %d reached %s addressed to %s, want %s", i, s.name, dst, want)
				}
				got[s.name]++
			}
		}
	}
	total := 0
	for _, n := range got {
		total += n
	}
	if total != flows || len(got) != len(e.Backends) {
		t.Errorf("%d SCTP INITs arrived as %v, want all %d spread over the %d backends", total, got, flows, len(e.Backends))
	}
	out, err := testutil.RunErr(e.LB.Name, "conntrack", "-L", "-p", "sctp")
	if err != nil && !strings.Contains(out, "flow entries") {
		t.Fatal(err)
	}
	if n := strings.Count(out, "dport="+strconv.Itoa(int(f.VirtualPorts[0].First))); n < flows {
		t.Errorf("conntrack lists %d SCTP entries to the VIP port, want %d:\n%s", n, flows, out)
	}
}
