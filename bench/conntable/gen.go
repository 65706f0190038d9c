package main

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"runtime"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The generator runs in the client namespace as
//
//	conntable gen DST PORT FIRST FLOWS COUNT DURATION
//
// and sends COUNT 18-byte UDP datagrams (46-byte IP packets, 64-byte
// frames) to DST:PORT, round robin over the flows FIRST .. FIRST+FLOWS-1,
// stopping early after DURATION. Flow i has its own source address and port
// (flowSource), so FLOWS distinct flows are FLOWS conntrack entries at the
// LB. It writes whole IP headers on a raw socket (the sources are not local
// addresses) in batches of genBatch with sendmmsg, so the generator's own
// cost per packet is small next to the path it measures.
//
// It prints "sent seconds cpu_ns": the packets the kernel took, the time
// they took, and the CPU time of the sending thread (RUSAGE_THREAD). Over
// veth, the LB's and the backends' processing of a packet runs in softirq on
// the sending CPU when the send returns, so cpu_ns covers the whole path
// (client send, LB, backend sink) as long as ksoftirqd does not take over.
const (
	genBatch  = 64
	pktLen    = 20 + 8 + 18
	portFirst = 1024
	portsPer  = 64000 // source ports per source address
)

// flowSource is the source address and port of flow i: 10.101.0.0/16 is
// routed to the client by the LB, never assigned to an interface.
func flowSource(i int) (netip.Addr, uint16) {
	host := 1 + i/portsPer // 10.101.0.1 and up; 64000 flows each
	return netip.AddrFrom4([4]byte{10, 101, byte(host >> 8), byte(host)}), uint16(portFirst + i%portsPer)
}

// sourceNet is the prefix of every flowSource (up to 16.7 M flows).
const sourceNet = "10.101.0.0/16"

// mmsghdr is struct mmsghdr of <sys/socket.h> (64-bit).
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
	_   [4]byte
}

func gen(args []string) error {
	if len(args) != 6 {
		return fmt.Errorf("usage: conntable gen DST PORT FIRST FLOWS COUNT DURATION")
	}
	dst, err := netip.ParseAddr(args[0])
	port, err1 := strconv.Atoi(args[1])
	first, err2 := strconv.Atoi(args[2])
	flows, err3 := strconv.Atoi(args[3])
	count, err4 := strconv.Atoi(args[4])
	d, err5 := time.ParseDuration(args[5])
	for _, e := range []error{err, err1, err2, err3, err4, err5} {
		if e != nil {
			return fmt.Errorf("gen: %w", e)
		}
	}
	if !dst.Is4() || port < 1 || port > 65535 || first < 0 || flows < 1 || first+flows > 250*portsPer ||
		count < 1 || count > 1e9 || d <= 0 || d > 10*time.Minute {
		return fmt.Errorf("gen: bad arguments %q", args)
	}

	runtime.LockOSThread()                                                // RUSAGE_THREAD measures this thread
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW) // IP_HDRINCL implied
	if err != nil {
		return fmt.Errorf("gen: raw socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: dst.As4()}); err != nil {
		return fmt.Errorf("gen: connect raw socket to %s: %w", dst, err)
	}

	// One buffer, iovec and header per packet of a batch; the constant
	// fields are written once.
	bufs := make([][pktLen]byte, genBatch)
	iovs := make([]unix.Iovec, genBatch)
	msgs := make([]mmsghdr, genBatch)
	d4 := dst.As4()
	for i := range bufs {
		b := bufs[i][:]
		b[0] = 0x45                               // IPv4, 20-byte header
		binary.BigEndian.PutUint16(b[2:], pktLen) // total length
		binary.BigEndian.PutUint16(b[6:], 0x4000) // don't fragment; id and checksum: the kernel's
		b[8] = 64                                 // TTL
		b[9] = unix.IPPROTO_UDP
		copy(b[16:20], d4[:])
		binary.BigEndian.PutUint16(b[22:], uint16(port))
		binary.BigEndian.PutUint16(b[24:], pktLen-20)
		iovs[i].Base = &bufs[i][0]
		iovs[i].SetLen(pktLen)
		msgs[i].hdr.Iov = &iovs[i]
		msgs[i].hdr.SetIovlen(1)
	}
	// UDP checksum: the pseudo header and the header's constant words
	// (the payload is zeros), plus each packet's source address and port.
	var base uint32
	base += uint32(d4[0])<<8 | uint32(d4[1])
	base += uint32(d4[2])<<8 | uint32(d4[3])
	base += unix.IPPROTO_UDP + (pktLen - 20) // protocol, UDP length
	base += uint32(port) + (pktLen - 20)     // destination port, UDP length

	var ru0, ru1 unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru0); err != nil {
		return fmt.Errorf("gen: getrusage: %w", err)
	}
	start := time.Now()
	deadline := start.Add(d)
	sent, next := 0, 0
	for batches := 0; sent < count; batches++ {
		if batches%16 == 0 && time.Now().After(deadline) {
			break
		}
		n := min(genBatch, count-sent)
		for k := range n {
			src, sport := flowSource(first + next)
			if next++; next == flows {
				next = 0
			}
			b := bufs[k][:]
			s4 := src.As4()
			copy(b[12:16], s4[:])
			binary.BigEndian.PutUint16(b[20:], sport)
			sum := base + (uint32(s4[0])<<8 | uint32(s4[1]))
			sum += uint32(s4[2])<<8 | uint32(s4[3])
			sum += uint32(sport)
			for sum > 0xffff {
				sum = sum&0xffff + sum>>16
			}
			c := ^uint16(sum)
			if c == 0 {
				c = 0xffff
			}
			binary.BigEndian.PutUint16(b[26:], c)
		}
		r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])), uintptr(n), 0, 0, 0)
		switch {
		case e == 0:
			sent += int(r)
		case e == syscall.ENOBUFS || e == syscall.EAGAIN || e == syscall.EINTR:
			// a full queue: these packets were not sent, go on
		default:
			return fmt.Errorf("gen: sendmmsg: %w", e)
		}
	}
	secs := time.Since(start).Seconds()
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru1); err != nil {
		return fmt.Errorf("gen: getrusage: %w", err)
	}
	runtime.KeepAlive(bufs)
	runtime.KeepAlive(iovs)
	cpu := (ru1.Utime.Nano() + ru1.Stime.Nano()) - (ru0.Utime.Nano() + ru0.Stime.Nano())
	fmt.Println(sent, secs, cpu)
	return nil
}
