package lvs

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"

	"github.com/xlb-lb/xlb/internal/model"
)

// ipvsadm's rules as `ipvsadm-save -n` (`ipvsadm -S -n`) writes them, one
// command a line (the "ipvsadm" in front is optional, as in a script):
//
//	-A -t 192.0.2.10:80 -s wrr -p 300
//	-a -t 192.0.2.10:80 -r 10.0.0.11:8080 -m -w 2
//
// ipvsadm(8)'s defaults: scheduler wlc, persistence 300 s when -p has no
// value, a real server forwarded by gatewaying (-g, direct routing),
// weight 1.
const (
	ipvsadmDefaultPersist = 300
)

// ipvsService is one -A line and the -a lines of its service.
type ipvsService struct {
	farm   model.Farm
	where  string
	method string // of the first real server: "-m", "-g" or "-i"
	port   uint16
}

// ConvertIPVSAdm reads ipvsadm-save's rules from r (name names it in
// errors) and returns a farm per service.
func ConvertIPVSAdm(r io.Reader, name string) (*Result, error) {
	res := &Result{}
	var order []string
	svcs := map[string]*ipvsService{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) > 0 && (f[0] == "ipvsadm" || strings.HasSuffix(f[0], "/ipvsadm")) {
			f = f[1:]
		}
		if len(f) == 0 {
			continue
		}
		where := fmt.Sprintf("%s:%d", name, n)
		cmd, err := parseIPVSLine(f, where)
		if err != nil {
			return nil, err
		}
		switch cmd.op {
		case "clear":
			res.notef(where, "-C: the state file replaces the whole state anyway")
		case "add-service":
			if prev, dup := svcs[cmd.key]; dup {
				return nil, fmt.Errorf("%s: service %s is added twice (first at %s)", where, cmd.key, prev.where)
			}
			s, err := cmd.service(where, res)
			if err != nil {
				return nil, err
			}
			svcs[cmd.key] = s
			order = append(order, cmd.key)
		case "add-server":
			s, ok := svcs[cmd.key]
			if !ok {
				return nil, fmt.Errorf("%s: real server of service %s, which no -A line before adds", where, cmd.key)
			}
			if err := cmd.server(s, where, res); err != nil {
				return nil, err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	for _, k := range order {
		s := svcs[k]
		if err := s.farm.Validate(); err != nil {
			return nil, fmt.Errorf("%s: service %s: %w", s.where, k, err)
		}
		res.Farms = append(res.Farms, s.farm)
	}
	return res, nil
}

// ipvsCmd is one line's command and options.
type ipvsCmd struct {
	op        string // add-service, add-server, clear
	proto     model.Protocol
	key       string // the service as given: "-t 192.0.2.10:80"
	addr      netip.Addr
	port      uint16
	mark      uint32
	sched     string
	schedPort bool // -b sh-port or mh-port
	persist   *uint32
	mask      string
	ops       bool
	real      netip.AddrPort
	realSet   bool
	method    string
	weight    *uint32
	upper     *uint32
}

func parseIPVSLine(f []string, where string) (*ipvsCmd, error) {
	c := &ipvsCmd{}
	value := func(i *int, opt string) (string, error) {
		if *i+1 >= len(f) {
			return "", fmt.Errorf("%s: %s needs a value", where, opt)
		}
		*i++
		return f[*i], nil
	}
	number := func(i *int, opt string) (uint32, error) {
		v, err := value(i, opt)
		if err != nil {
			return 0, err
		}
		x, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("%s: %s %q: want a number", where, opt, v)
		}
		return uint32(x), nil
	}
	for i := 0; i < len(f); i++ {
		o := f[i]
		switch o {
		case "-A", "--add-service":
			c.op = "add-service"
		case "-a", "--add-server":
			c.op = "add-server"
		case "-C", "--clear":
			c.op = "clear"
		case "-E", "--edit-service", "-e", "--edit-server", "-D", "--delete-service", "-d", "--delete-server", "-Z", "--zero", "--set", "--start-daemon", "--stop-daemon":
			return nil, fmt.Errorf("%s: %s is not a rule ipvsadm-save writes: give the rules as ipvsadm-save -n lists them", where, o)
		case "-t", "--tcp-service", "-u", "--udp-service", "--sctp-service":
			v, err := value(&i, o)
			if err != nil {
				return nil, err
			}
			ap, err := netip.ParseAddrPort(v)
			if err != nil {
				return nil, fmt.Errorf("%s: %s %q: want ADDRESS:PORT ([ADDRESS]:PORT for IPv6)", where, o, v)
			}
			c.addr, c.port = ap.Addr().Unmap(), ap.Port()
			c.proto = map[string]model.Protocol{"-t": model.ProtoTCP, "--tcp-service": model.ProtoTCP, "-u": model.ProtoUDP,
				"--udp-service": model.ProtoUDP, "--sctp-service": model.ProtoSCTP}[o]
			c.key = o[:2] + " " + v
			if o == "--sctp-service" {
				c.key = o + " " + v
			}
		case "-f", "--fwmark-service":
			m, err := number(&i, o)
			if err != nil {
				return nil, err
			}
			if m == 0 {
				return nil, fmt.Errorf("%s: %s 0: a mark service needs a mark above 0", where, o)
			}
			c.mark, c.proto, c.key = m, model.ProtoAll, "-f "+strconv.FormatUint(uint64(m), 10)
		case "-s", "--scheduler":
			v, err := value(&i, o)
			if err != nil {
				return nil, err
			}
			c.sched = v
		case "-p", "--persistent":
			t := uint32(ipvsadmDefaultPersist)
			if i+1 < len(f) && !strings.HasPrefix(f[i+1], "-") {
				var err error
				if t, err = number(&i, o); err != nil {
					return nil, err
				}
			}
			c.persist = &t
		case "-M", "--netmask":
			v, err := value(&i, o)
			if err != nil {
				return nil, err
			}
			c.mask = v
		case "-o", "--ops":
			c.ops = true
		case "-r", "--real-server":
			v, err := value(&i, o)
			if err != nil {
				return nil, err
			}
			ap, err := netip.ParseAddrPort(v)
			if err != nil {
				a, aerr := netip.ParseAddr(strings.Trim(v, "[]"))
				if aerr != nil {
					return nil, fmt.Errorf("%s: %s %q: want ADDRESS[:PORT]", where, o, v)
				}
				ap = netip.AddrPortFrom(a, 0)
			}
			c.real, c.realSet = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
		case "-g", "--gatewaying", "-m", "--masquerading", "-i", "--ipip":
			c.method = map[string]string{"-g": "-g", "--gatewaying": "-g", "-m": "-m", "--masquerading": "-m", "-i": "-i", "--ipip": "-i"}[o]
		case "-w", "--weight":
			w, err := number(&i, o)
			if err != nil {
				return nil, err
			}
			c.weight = &w
		case "-x", "--u-threshold":
			u, err := number(&i, o)
			if err != nil {
				return nil, err
			}
			c.upper = &u
		case "-y", "--l-threshold":
			if _, err := number(&i, o); err != nil {
				return nil, err
			}
		case "-b", "--sched-flags":
			v, err := value(&i, o)
			if err != nil {
				return nil, err
			}
			for _, fl := range strings.Split(v, ",") {
				switch fl {
				case "sh-port", "mh-port":
					c.schedPort = true
				case "sh-fallback", "mh-fallback", "flag-1", "flag-2", "flag-3":
				default:
					return nil, fmt.Errorf("%s: %s %s: unknown scheduler flag", where, o, fl)
				}
			}
		case "-n", "--numeric":
		default:
			return nil, fmt.Errorf("%s: %s is not imported (xlb has no equivalent)", where, o)
		}
	}
	if c.op == "" {
		return nil, fmt.Errorf("%s: neither -A, -a nor -C", where)
	}
	if c.op != "clear" && c.key == "" {
		return nil, fmt.Errorf("%s: no service (-t, -u, --sctp-service or -f)", where)
	}
	if c.op == "add-server" && !c.realSet {
		return nil, fmt.Errorf("%s: -a without -r", where)
	}
	return c, nil
}

// service makes the farm of an -A line.
func (c *ipvsCmd) service(where string, res *Result) (*ipvsService, error) {
	f := model.NewFarm("vs")
	f.Protocol, f.Mode, f.Scheduler = c.proto, model.ModeDNAT, model.SchedWLC
	if c.mark != 0 {
		f.Mark = c.mark
	} else {
		f.VirtualAddr = c.addr
		if c.addr.Is6() {
			f.Family = model.FamilyIPv6
		}
		if c.port != 0 {
			f.VirtualPorts = []model.PortRange{{First: c.port, Last: c.port}}
		}
	}
	if c.sched != "" {
		if err := setSched(&f, c.sched, where+": -s"); err != nil {
			return nil, err
		}
	}
	finishSched(&f, c.schedPort, where+": "+c.key, res)
	if c.persist != nil {
		if *c.persist == 0 {
			return nil, fmt.Errorf("%s: -p 0: want a timeout above 0", where)
		}
		f.Persistence, f.PersistTTL = model.KeySrcIP, *c.persist
	}
	if c.mask != "" && c.mask != "255.255.255.255" && c.mask != "128" && c.mask != "32" {
		return nil, fmt.Errorf("%s: -M %s: xlb keeps sessions per client address only (255.255.255.255)", where, c.mask)
	}
	f.Name = farmName(f.VirtualAddr, c.port, f.Mark, f.Protocol)
	s := &ipvsService{farm: f, where: where, port: c.port}
	if c.ops {
		if f.Protocol != model.ProtoUDP || f.Persistence != 0 {
			return nil, fmt.Errorf("%s: -o (one-packet scheduling) is imported as a stateless farm (mode stlsdnat): UDP without persistence only", where)
		}
		s.farm.Mode = model.ModeStlsDNAT
		res.notef(where+": -o", "one-packet scheduling: imported as mode stlsdnat (stateless)")
	}
	return s, nil
}

// server adds an -a line's real server to its service's farm. The first
// real server's forwarding method is the farm's mode.
func (c *ipvsCmd) server(s *ipvsService, where string, res *Result) error {
	m := c.method
	if m == "" {
		m = "-g" // ipvsadm's default: gatewaying
	}
	if s.method == "" {
		s.method = m
		if s.farm.Mode != model.ModeStlsDNAT || m != "-m" {
			if err := setMethod(&s.farm, map[string]string{"-g": "DR", "-m": "NAT", "-i": "TUN"}[m], where+": forwarding method"); err != nil {
				return err
			}
		}
	} else if m != s.method {
		return fmt.Errorf("%s: real server forwarded with %s, its service's first with %s: an xlb farm forwards to all its backends one way", where, m, s.method)
	}
	if s.farm.Mode == model.ModeStlsDNAT && m != "-m" {
		return fmt.Errorf("%s: -o with %s: a stateless farm (mode stlsdnat) translates (-m)", where, m)
	}
	a := c.real.Addr()
	name := strings.ReplaceAll(a.String(), ":", "-")
	if c.real.Port() != 0 {
		name += "_" + strconv.Itoa(int(c.real.Port()))
	}
	for _, b := range s.farm.Backends {
		if b.Name == name {
			return fmt.Errorf("%s: real server %s is added twice to service %s", where, c.real, c.key)
		}
	}
	b := model.NewBackend(name)
	b.Addr = a
	if s.farm.Mode == model.ModeDSR {
		if p := c.real.Port(); p != 0 && p != s.port {
			res.notef(where+": -r", fmt.Sprintf("port %d ignored: DR (dsr) reaches the real server on the virtual port", p))
		}
	} else {
		b.Port = c.real.Port()
	}
	if c.weight != nil {
		b.Weight = *c.weight
	}
	if c.upper != nil {
		b.EstConnLimit = *c.upper
		res.notef(where+": -x", "imported as the backend's est-connlimit (established connections)")
	}
	s.farm.Backends = append(s.farm.Backends, b)
	return nil
}
