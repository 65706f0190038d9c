package model

import (
	"bufio"
	"bytes"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
)

// ListingHeader is the header of the ipvsadm-style listing (`xlb list`,
// GET /farms?format=ipvsadm); each farm's AppendListing follows it.
const ListingHeader = "Prot LocalAddress:Port Scheduler Flags\n" +
	"  -> RemoteAddress:Port           Forward Weight State\n"

// AppendListing appends the farm's lines of the ipvsadm -L style listing:
//
//	TCP  10.0.0.1:80 rr persistent 60
//	  -> 10.200.0.11:80               Masq    1      up
//
// Without numeric, well-known ports are shown by their /etc/services names
// (addresses are never looked up). Sealed farms cache both forms, so listing
// 16,000 farms is a concatenation of cached text.
func (f *Farm) AppendListing(dst []byte, numeric bool) []byte {
	if f.enc == nil {
		return f.appendListing(dst, numeric, lookupService)
	}
	i := 1
	if numeric {
		i = 0
	}
	f.enc.listOnce[i].Do(func() { f.enc.list[i] = f.appendListing(nil, numeric, lookupService) })
	return append(dst, f.enc.list[i]...)
}

// serviceLookup names a port of a protocol ("http" for 80/tcp).
type serviceLookup func(port uint16, proto Protocol) (string, bool)

// AppendListingExtra appends the farm's lines as AppendListing does, with
// extra(i) at the end of backend i's line (health). It is not cached.
func (f *Farm) AppendListingExtra(dst []byte, numeric bool, extra func(i int) string) []byte {
	return f.appendListingExtra(dst, numeric, lookupService, extra)
}

func (f *Farm) appendListing(dst []byte, numeric bool, svc serviceLookup) []byte {
	return f.appendListingExtra(dst, numeric, svc, nil)
}

func (f *Farm) appendListingExtra(dst []byte, numeric bool, svc serviceLookup, extra func(i int) string) []byte {
	if numeric {
		svc = nil
	}
	dst = f.appendFarmColumn(dst, svc)
	dst = append(dst, ' ')
	dst = append(dst, f.Scheduler.String()...)
	if f.SchedParam != 0 {
		dst = append(dst, " ("...)
		dst = append(dst, f.SchedParam.String()...)
		dst = append(dst, ')')
	}
	if f.Persistence != 0 {
		dst = append(dst, " persistent "...)
		dst = strconv.AppendUint(dst, uint64(f.PersistTTL), 10)
		if f.Persistence != KeySrcIP {
			dst = append(dst, " ("...)
			// One word in the listing's columns, as ipvsadm users read it.
			dst = append(dst, strings.ReplaceAll(persistenceName(f.Persistence), " ", "-")...)
			dst = append(dst, ')')
		}
	}
	if f.VirtualAddr2.IsValid() {
		dst = append(dst, " dual "...)
		dst = f.VirtualAddr2.AppendTo(dst)
	}
	if f.SourceAddr.IsValid() {
		dst = append(dst, " source-addr "...)
		dst = f.SourceAddr.AppendTo(dst)
	}
	if f.Helper != HelperNone {
		dst = append(dst, " helper "...)
		dst = append(dst, f.Helper.String()...)
	}
	if f.Mark != 0 && !f.IsMarkFarm() {
		dst = append(dst, " mark 0x"...)
		dst = strconv.AppendUint(dst, uint64(f.Mark), 16)
	}
	if f.Log != 0 {
		dst = append(dst, " log "...)
		dst = append(dst, strings.ReplaceAll(f.Log.String(), " ", ",")...)
	}
	dst = appendLimit(dst, " new-rtlimit ", f.NewRTLimit, f.NewRTBurst)
	dst = appendLimit(dst, " rst-rtlimit ", f.RstRTLimit, f.RstRTBurst)
	dst = appendLimit(dst, " est-connlimit ", f.EstConnLimit, 0)
	if f.TCPStrict {
		dst = append(dst, " tcp-strict"...)
	}
	if f.State != StateUp {
		dst = append(dst, ' ')
		dst = append(dst, f.State.String()...)
	}
	dst = append(dst, '\n')

	fwd := listingForward(f.Mode)
	var col []byte
	for i := range f.Backends {
		b := &f.Backends[i]
		col = f.appendBackendColumn(col[:0], b, svc)
		dst = append(dst, "  -> "...)
		dst = appendPadded(dst, col, 28)
		dst = append(dst, ' ')
		dst = appendPadded(dst, []byte(fwd), 7)
		dst = append(dst, ' ')
		dst = appendPadded(dst, strconv.AppendUint(nil, uint64(b.Weight), 10), 6)
		dst = append(dst, ' ')
		dst = append(dst, b.State.String()...)
		if b.Priority != 1 {
			dst = append(dst, " priority "...)
			dst = strconv.AppendUint(dst, uint64(b.Priority), 10)
		}
		if b.Mark != 0 {
			dst = append(dst, " mark 0x"...)
			dst = strconv.AppendUint(dst, uint64(b.Mark), 16)
		}
		dst = appendLimit(dst, " est-connlimit ", b.EstConnLimit, 0)
		if extra != nil {
			dst = append(dst, extra(i)...)
		}
		dst = append(dst, '\n')
	}
	return dst
}

func listingProto(p Protocol) string {
	switch p {
	case ProtoTCP:
		return "TCP  "
	case ProtoUDP:
		return "UDP  "
	case ProtoSCTP:
		return "SCTP "
	}
	return "ALL  "
}

// listingForward names a mode as ipvsadm's Forward column does.
func listingForward(m Mode) string {
	switch m {
	case ModeSNAT:
		return "Masq"
	case ModeDNAT:
		return "Dnat"
	case ModeDSR:
		return "Route"
	case ModeStlsDNAT:
		return "Stls"
	}
	return m.String()
}

func appendLimit(dst []byte, label string, limit, burst uint32) []byte {
	if limit == 0 {
		return dst
	}
	dst = append(dst, label...)
	dst = strconv.AppendUint(dst, uint64(limit), 10)
	if burst != 0 {
		dst = append(dst, '/')
		dst = strconv.AppendUint(dst, uint64(burst), 10)
	}
	return dst
}

// appendHostPorts appends "10.0.0.1:80,443" or "[2001:db8::1]:80"; no ports
// (every port) is ":0" as in ipvsadm.
func appendHostPorts(dst []byte, a netip.Addr, ports []PortRange, proto Protocol, svc serviceLookup) []byte {
	if a.Is6() {
		dst = append(dst, '[')
		dst = a.AppendTo(dst)
		dst = append(dst, ']')
	} else {
		dst = a.AppendTo(dst)
	}
	dst = append(dst, ':')
	if len(ports) == 0 {
		return append(dst, '0')
	}
	for i, r := range ports {
		if i > 0 {
			dst = append(dst, ',')
		}
		if r.First == r.Last && svc != nil {
			if name, ok := svc(r.First, proto); ok {
				dst = append(dst, name...)
				continue
			}
		}
		dst = strconv.AppendUint(dst, uint64(r.First), 10)
		if r.Last != r.First {
			dst = append(dst, '-')
			dst = strconv.AppendUint(dst, uint64(r.Last), 10)
		}
	}
	return dst
}

func appendPadded(dst, s []byte, width int) []byte {
	dst = append(dst, s...)
	for n := len(s); n < width; n++ {
		dst = append(dst, ' ')
	}
	return dst
}

// ServicesFile is where port names come from (read once, on first use).
const ServicesFile = "/etc/services"

var services struct {
	once sync.Once
	m    map[serviceKey]string
}

type serviceKey struct {
	port  uint16
	proto Protocol
}

func lookupService(port uint16, proto Protocol) (string, bool) {
	services.once.Do(func() {
		fh, err := os.Open(ServicesFile)
		if err != nil {
			return // no names: listings stay numeric
		}
		defer fh.Close()
		services.m = parseServices(fh)
	})
	if proto == ProtoAll {
		proto = ProtoTCP
	}
	name, ok := services.m[serviceKey{port, proto}]
	return name, ok
}

// parseServices reads the services(5) format: "name port/proto [aliases] [# comment]".
// The first name listed for a port and protocol wins.
func parseServices(r io.Reader) map[serviceKey]string {
	m := make(map[serviceKey]string, 512)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Bytes()
		if i := bytes.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		fields := strings.Fields(string(line))
		if len(fields) < 2 {
			continue
		}
		portText, protoText, ok := strings.Cut(fields[1], "/")
		if !ok {
			continue
		}
		port, err := strconv.ParseUint(portText, 10, 16)
		if err != nil || port == 0 {
			continue
		}
		proto, ok := protocolSpec.parse(protoText)
		if !ok || proto == ProtoAll {
			continue
		}
		k := serviceKey{uint16(port), proto}
		if _, dup := m[k]; !dup {
			m[k] = fields[0]
		}
	}
	return m
}

// appendBackendColumn appends a backend's address column of the listings:
// its address and port, or the farm's ports when its port is 0 (the port the
// client connected to), or the address alone in a firewall-mark farm.
func (f *Farm) appendBackendColumn(col []byte, b *Backend, svc serviceLookup) []byte {
	switch {
	case b.Port != 0:
		return appendHostPorts(col, b.Addr, []PortRange{{b.Port, b.Port}}, f.Protocol, svc)
	case f.IsMarkFarm():
		return appendHostPorts(col, b.Addr, nil, f.Protocol, svc)
	default:
		return appendHostPorts(col, b.Addr, f.VirtualPorts, f.Protocol, svc)
	}
}

// appendFarmColumn appends a farm's first column of the listings: the
// protocol and VIP with its ports, or FWM and the mark.
func (f *Farm) appendFarmColumn(col []byte, svc serviceLookup) []byte {
	if f.IsMarkFarm() {
		col = append(col, "FWM  "...)
		return strconv.AppendUint(col, uint64(f.Mark), 10)
	}
	col = append(col, listingProto(f.Protocol)...)
	return appendHostPorts(col, f.VirtualAddr, f.VirtualPorts, f.Protocol, svc)
}
