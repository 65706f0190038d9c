package conformance

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TFTP port of the helper-tftp scenario: the farm listens on 69 and the
// backend's scripted TFTP server on 6969 (the helper follows the farm, not
// the port).
const (
	tftpVPort = 69
	tftpBPort = 6969
)

// TFTP opcodes (RFC 1350).
const (
	tftpRRQ  = 1
	tftpDATA = 3
	tftpACK  = 4
)

// startTFTPServer answers every read request on [::]:tftpBPort in the
// backend's namespace as a TFTP server does: from a new socket (a new
// source port), one DATA block holding "tftp from <backend>", then it waits
// for the client's ACK and reports on acked whether it came.
func startTFTPServer(t *testing.T, b testutil.Host, name string, acked chan<- bool) {
	var pc net.PacketConn
	if err := testutil.Do(b.NS, func() error {
		var err error
		pc, err = net.ListenPacket("udp", fmt.Sprintf("[::]:%d", tftpBPort))
		return err
	}); err != nil {
		t.Fatalf("tftp server: %v", err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if n < 4 || binary.BigEndian.Uint16(buf) != tftpRRQ {
				continue
			}
			go serveTFTPRead(b.NS, from, "tftp from "+name, acked)
		}
	}()
}

// serveTFTPRead sends the one-block file to client from a fresh port.
func serveTFTPRead(ns netns.NsHandle, client net.Addr, content string, acked chan<- bool) {
	var c net.PacketConn
	if err := testutil.Do(ns, func() error {
		var err error
		c, err = net.ListenPacket("udp", "[::]:0")
		return err
	}); err != nil {
		acked <- false
		return
	}
	defer c.Close()
	data := binary.BigEndian.AppendUint16(nil, tftpDATA)
	data = binary.BigEndian.AppendUint16(data, 1)
	data = append(data, content...) // under 512 bytes: the last block
	buf := make([]byte, 1500)
	for range 3 { // resend on a lost ACK, as servers do
		if _, err := c.WriteTo(data, client); err != nil {
			break
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		n, _, err := c.ReadFrom(buf)
		if err == nil && n >= 4 && binary.BigEndian.Uint16(buf) == tftpACK && binary.BigEndian.Uint16(buf[2:]) == 1 {
			acked <- true
			return
		}
	}
	acked <- false
}

// runTFTP: curl (Debian's, a real TFTP client) reads a file through an
// snat farm with helper tftp. The server answers from a new port, which no
// NAT entry covers; only the helper's expectation brings the DATA back to
// the client and the client's ACK to the server.
func runTFTP(t *testing.T, e *Env, f model.Farm) {
	acked := make(chan bool, 4)
	startTFTPServer(t, e.Backends[0], "b0", acked)
	e.Put(t, f)
	url := fmt.Sprintf("tftp://%s/hello.txt", netip.AddrPortFrom(f.VirtualAddr, tftpVPort))
	out, err := testutil.RunErr(e.Client.Name, "curl", "-sS", "--max-time", "8", url)
	if err != nil || strings.TrimSpace(out) != "tftp from b0" {
		t.Fatalf("curl %s: %q, %v (want the backend's file: the tftp helper must map the server's new port)", url, out, err)
	}
	select {
	case ok := <-acked:
		if !ok {
			t.Error("the client's ACK never reached the TFTP server")
		}
	case <-time.After(5 * time.Second):
		t.Error("the TFTP server saw no ACK")
	}
}
