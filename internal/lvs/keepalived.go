package lvs

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/xlb-lb/xlb/internal/model"
)

// keepalived 2.2.7's defaults (keepalived.conf(5); the scheduler's,
// forwarding method's and protocol's as `keepalived -t` reports them: "no
// scheduler set, setting default 'wlc'", "no forwarding method set,
// setting default NAT", "no protocol set - defaulting to UDP", which
// TestDefaultsAsKeepalived checks).
const (
	defaultDelayLoop      = 60 * time.Second
	defaultConnectTimeout = 5 * time.Second
	defaultRetry          = 1
	defaultRetryMisc      = 0
	defaultDelayRetry     = time.Second
	defaultDelayRetryHTTP = 3 * time.Second
	defaultPersistTTL     = 360 // persistence_timeout without a value: 6 minutes
)

// defaultStatus is HTTP_GET's default status_code: 200-299 (xlb's own
// default is 200-399, so an imported check always names its range).
var defaultStatus = []model.StatusRange{{First: 200, Last: 299}}

// checkerOpts are the options keepalived lets a virtual server, a real
// server and a checker each set, the nearer overriding (nil: not set).
type checkerOpts struct {
	connectTimeout *time.Duration
	retry          *int
	delayRetry     *time.Duration
	delayLoop      *time.Duration
	alpha          *bool
	inhibit        *bool
	virtualhost    *string
}

// Convert turns the configuration's virtual servers into farms. It refuses
// what xlb cannot do as keepalived and IPVS would, naming the statement.
func ConvertKeepalived(nodes []*Node) (*Result, error) {
	res := &Result{}
	names := map[string]string{}
	for _, n := range nodes {
		switch {
		case n.Key == "virtual_server":
			f, err := convertVS(n, res)
			if err != nil {
				return nil, err
			}
			if prev, dup := names[f.Name]; dup {
				return nil, fmt.Errorf("%s: virtual_server %s is declared twice (first at %s)", n.Where(), strings.Join(n.Args, " "), prev)
			}
			names[f.Name] = n.Where()
			res.Farms = append(res.Farms, f)
		case n.Key == "virtual_server_group":
			return nil, fmt.Errorf("%s: virtual_server_group %s: groups are not imported; declare a virtual_server for each of its addresses", n.Where(), strings.Join(n.Args, " "))
		case strings.HasPrefix(n.Key, "vrrp_"):
			res.note(n, "VRRP is not imported: keep keepalived for it beside xlb (docs/lvs-import.md)")
		default:
			res.note(n, "not an LVS setting: skipped")
		}
	}
	return res, nil
}

func convertVS(n *Node, res *Result) (model.Farm, error) {
	if !n.Block {
		return model.Farm{}, fmt.Errorf("%s: virtual_server without a block", n.Where())
	}
	f := model.NewFarm("vs")
	f.Mode = model.ModeDNAT
	f.Scheduler = model.SchedWLC
	f.Protocol = model.ProtoUDP // IPVS's default too
	var port uint16
	switch {
	case len(n.Args) == 2 && n.Args[0] == "fwmark":
		m, err := strconv.ParseUint(n.Args[1], 10, 32)
		if err != nil || m == 0 {
			return f, fmt.Errorf("%s: virtual_server fwmark %q: want a mark of 1 to 4294967295", n.Where(), n.Args[1])
		}
		f.Mark = uint32(m)
		f.Protocol = model.ProtoAll // a mark service takes every protocol the mark does
	case len(n.Args) == 2 && n.Args[0] == "group":
		return f, fmt.Errorf("%s: virtual_server group %s: groups are not imported; declare a virtual_server for each of its addresses", n.Where(), n.Args[1])
	case len(n.Args) == 1 || len(n.Args) == 2:
		a, err := netip.ParseAddr(n.Args[0])
		if err != nil {
			return f, fmt.Errorf("%s: virtual_server %q: not an IP address", n.Where(), n.Args[0])
		}
		f.VirtualAddr = a.Unmap()
		if len(n.Args) == 2 {
			p, err := strconv.ParseUint(n.Args[1], 10, 16)
			if err != nil {
				return f, fmt.Errorf("%s: virtual_server port %q: want 0 to 65535", n.Where(), n.Args[1])
			}
			port = uint16(p)
		}
		if port != 0 {
			f.VirtualPorts = []model.PortRange{{First: port, Last: port}}
		}
		if f.VirtualAddr.Is6() {
			f.Family = model.FamilyIPv6
		}
	default:
		return f, fmt.Errorf("%s: virtual_server takes ADDRESS [PORT], fwmark MARK or group NAME", n.Where())
	}

	var vsOpts checkerOpts
	var sorry *Node
	var quorum, hysteresis *uint32
	var reals []*Node
	var ops *Node
	schedPort := false
	for _, c := range n.Children {
		ok, err := vsOpts.set(c)
		if err != nil {
			return f, err
		}
		if ok {
			continue
		}
		switch c.Key {
		case "lb_algo", "lvs_sched":
			if err := setSched(&f, arg(c), c.Where()+": "+c.Key); err != nil {
				return f, err
			}
		case "lb_kind", "lvs_method":
			if err := setMethod(&f, arg(c), c.Where()+": "+c.Key); err != nil {
				return f, err
			}
		case "protocol":
			if f.Mark != 0 {
				res.note(c, "no effect on a fwmark service (keepalived ignores it too)")
				continue
			}
			switch strings.ToUpper(arg(c)) {
			case "TCP":
				f.Protocol = model.ProtoTCP
			case "UDP":
				f.Protocol = model.ProtoUDP
			case "SCTP":
				f.Protocol = model.ProtoSCTP
			default:
				return f, fmt.Errorf("%s: protocol %q: want TCP, UDP or SCTP", c.Where(), arg(c))
			}
		case "persistence_timeout":
			ttl := uint32(defaultPersistTTL)
			if len(c.Args) > 0 {
				v, err := strconv.ParseUint(c.Args[0], 10, 32)
				if err != nil || v == 0 {
					return f, fmt.Errorf("%s: persistence_timeout %q: want seconds above 0", c.Where(), c.Args[0])
				}
				ttl = uint32(v)
			}
			f.Persistence, f.PersistTTL = model.KeySrcIP, ttl
		case "persistence_granularity":
			if g := arg(c); g != "255.255.255.255" && g != "128" && g != "32" {
				return f, fmt.Errorf("%s: persistence_granularity %s: xlb keeps sessions per client address only (255.255.255.255)", c.Where(), g)
			}
		case "ip_family":
			if arg(c) == "inet6" {
				f.Family = model.FamilyIPv6
			}
		case "quorum", "hysteresis":
			v, err := strconv.ParseUint(arg(c), 10, 32)
			if err != nil {
				return f, fmt.Errorf("%s: %s %q: want a number", c.Where(), c.Key, arg(c))
			}
			x := uint32(v)
			if c.Key == "quorum" {
				quorum = &x
			} else {
				hysteresis = &x
			}
		case "sorry_server":
			sorry = c
		case "real_server":
			reals = append(reals, c)
		case "ops":
			ops = c
		case "quorum_up", "quorum_down", "smtp_alert", "snmp_name", "omega", "ha_suspend", "warmup",
			"sorry_server_inhibit", "sorry_server_lvs_method", "flag-1", "flag-2", "flag-3", "sh-fallback", "mh-fallback":
			res.note(c, "no effect in xlb")
		case "sh-port", "mh-port":
			schedPort = true
		default:
			return f, fmt.Errorf("%s: %s in a virtual_server is not imported (xlb has no equivalent)", c.Where(), c.Key)
		}
	}
	f.Name = farmName(f.VirtualAddr, port, f.Mark, f.Protocol)
	finishSched(&f, schedPort, n.Where()+": virtual_server "+strings.Join(n.Args, " "), res)
	if ops != nil {
		// One-packet scheduling: every datagram scheduled alone.
		if f.Protocol != model.ProtoUDP {
			return f, fmt.Errorf("%s: ops (one-packet scheduling) applies to UDP services", ops.Where())
		}
		if f.Persistence != 0 || f.Mode != model.ModeDNAT {
			return f, fmt.Errorf("%s: ops is imported as a stateless farm (mode stlsdnat), which takes neither persistence nor DR", ops.Where())
		}
		f.Mode = model.ModeStlsDNAT
		res.note(ops, "one-packet scheduling: imported as mode stlsdnat (stateless)")
	}

	// Real servers and their checkers.
	var checks []*model.Check
	var inhibits []bool
	seen := map[string]string{}
	for _, rs := range reals {
		b, chk, inhibit, err := convertRS(&f, rs, vsOpts, res)
		if err != nil {
			return f, err
		}
		if prev, dup := seen[b.Name]; dup {
			return f, fmt.Errorf("%s: real_server %s is declared twice in this virtual_server (first at %s)", rs.Where(), strings.Join(rs.Args, " "), prev)
		}
		seen[b.Name] = rs.Where()
		f.Backends = append(f.Backends, b)
		checks = append(checks, chk)
		inhibits = append(inhibits, inhibit)
	}
	if err := farmChecks(&f, n, checks, inhibits); err != nil {
		return f, err
	}
	if err := setQuorum(&f, n, quorum, hysteresis); err != nil {
		return f, err
	}
	if sorry != nil {
		if err := addSorry(&f, sorry); err != nil {
			return f, err
		}
	}
	if err := f.Validate(); err != nil {
		return f, fmt.Errorf("%s: virtual_server %s: %w", n.Where(), strings.Join(n.Args, " "), err)
	}
	return f, nil
}

func arg(n *Node) string {
	if len(n.Args) == 0 {
		return ""
	}
	return n.Args[0]
}

// set takes the options every level may set; false: c is not one.
func (o *checkerOpts) set(c *Node) (bool, error) {
	switch c.Key {
	case "connect_timeout":
		d, err := timer(c)
		o.connectTimeout = &d
		return true, err
	case "delay_before_retry":
		d, err := timer(c)
		o.delayRetry = &d
		return true, err
	case "delay_loop":
		d, err := timer(c)
		o.delayLoop = &d
		return true, err
	case "retry", "nb_get_retry", "nb_sock_retry":
		v, err := strconv.ParseUint(arg(c), 10, 16)
		if err != nil {
			return true, fmt.Errorf("%s: %s %q: want a count", c.Where(), c.Key, arg(c))
		}
		r := int(v)
		o.retry = &r
		return true, nil
	case "alpha", "inhibit_on_failure":
		b, err := boolArg(c)
		if c.Key == "alpha" {
			o.alpha = &b
		} else {
			o.inhibit = &b
		}
		return true, err
	case "virtualhost":
		v := arg(c)
		o.virtualhost = &v
		return true, nil
	}
	return false, nil
}

// over returns o with the options set in near replacing its own.
func (o checkerOpts) over(near checkerOpts) checkerOpts {
	return checkerOpts{
		connectTimeout: nearer(near.connectTimeout, o.connectTimeout),
		retry:          nearer(near.retry, o.retry),
		delayRetry:     nearer(near.delayRetry, o.delayRetry),
		delayLoop:      nearer(near.delayLoop, o.delayLoop),
		alpha:          nearer(near.alpha, o.alpha),
		inhibit:        nearer(near.inhibit, o.inhibit),
		virtualhost:    nearer(near.virtualhost, o.virtualhost),
	}
}

func nearer[T any](near, far *T) *T {
	if near != nil {
		return near
	}
	return far
}

// timer reads keepalived's TIMER: seconds, fractions allowed.
func timer(c *Node) (time.Duration, error) {
	v, err := strconv.ParseFloat(arg(c), 64)
	if err != nil || v < 0 || v > 86400 || math.IsNaN(v) {
		return 0, fmt.Errorf("%s: %s %q: want seconds (fractions allowed)", c.Where(), c.Key, arg(c))
	}
	return time.Duration(v * float64(time.Second)), nil
}

// boolArg reads an optional BOOL (a bare keyword is true).
func boolArg(c *Node) (bool, error) {
	switch strings.ToLower(arg(c)) {
	case "", "true", "on", "yes":
		return true, nil
	case "false", "off", "no":
		return false, nil
	}
	return false, fmt.Errorf("%s: %s %q: want true or false", c.Where(), c.Key, arg(c))
}

// convertRS makes a backend of a real server, with its checker (nil: not
// checked) and whether it asks inhibit_on_failure.
func convertRS(f *model.Farm, rs *Node, vsOpts checkerOpts, res *Result) (model.Backend, *model.Check, bool, error) {
	if len(rs.Args) < 1 || len(rs.Args) > 2 {
		return model.Backend{}, nil, false, fmt.Errorf("%s: real_server takes ADDRESS [PORT]", rs.Where())
	}
	a, err := netip.ParseAddr(rs.Args[0])
	if err != nil {
		return model.Backend{}, nil, false, fmt.Errorf("%s: real_server %q: not an IP address", rs.Where(), rs.Args[0])
	}
	a = a.Unmap()
	var port uint16
	if len(rs.Args) == 2 {
		p, err := strconv.ParseUint(rs.Args[1], 10, 16)
		if err != nil {
			return model.Backend{}, nil, false, fmt.Errorf("%s: real_server port %q: want 0 to 65535", rs.Where(), rs.Args[1])
		}
		port = uint16(p)
	}
	name := strings.ReplaceAll(a.String(), ":", "-")
	if port != 0 {
		name += "_" + strconv.Itoa(int(port))
	}
	b := model.NewBackend(name)
	b.Addr = a
	if f.Mode == model.ModeDSR {
		// DR reaches the real server on the virtual port: IPVS
		// ignores a real server's port there.
		if port != 0 && (len(f.VirtualPorts) == 0 || port != f.VirtualPorts[0].First) {
			res.note(rs, fmt.Sprintf("port %d ignored: DR (dsr) reaches the real server on the virtual port", port))
		}
	} else {
		b.Port = port
	}
	opts := vsOpts
	var checker *Node
	for _, c := range rs.Children {
		var o checkerOpts
		ok, err := o.set(c)
		if err != nil {
			return b, nil, false, err
		}
		if ok {
			opts = opts.over(o)
			continue
		}
		switch c.Key {
		case "weight":
			w, err := strconv.ParseUint(arg(c), 10, 32)
			if err != nil {
				return b, nil, false, fmt.Errorf("%s: weight %q: want a number", c.Where(), arg(c))
			}
			b.Weight = uint32(w)
		case "uthreshold":
			v, err := strconv.ParseUint(arg(c), 10, 32)
			if err != nil {
				return b, nil, false, fmt.Errorf("%s: uthreshold %q: want a number", c.Where(), arg(c))
			}
			b.EstConnLimit = uint32(v)
			res.note(c, "imported as the backend's est-connlimit (established connections)")
		case "lvs_method", "lb_kind":
			var g model.Farm
			g.Mode = f.Mode
			if err := setMethod(&g, arg(c), c.Where()+": "+c.Key); err != nil {
				return b, nil, false, err
			}
			if g.Mode != f.Mode {
				return b, nil, false, fmt.Errorf("%s: %s %s differs from its virtual_server's: an xlb farm forwards to all its backends one way", c.Where(), c.Key, arg(c))
			}
		case "TCP_CHECK", "HTTP_GET", "SSL_GET", "MISC_CHECK", "UDP_CHECK":
			if checker != nil {
				return b, nil, false, fmt.Errorf("%s: a second checker for real_server %s (the first at %s): xlb checks a backend one way", c.Where(), strings.Join(rs.Args, " "), checker.Where())
			}
			checker = c
		case "SMTP_CHECK", "DNS_CHECK", "BFD_CHECK", "PING_CHECK", "FILE_CHECK":
			return b, nil, false, fmt.Errorf("%s: %s is not imported: xlb checks tcp, http, https, udp, exec (MISC_CHECK) and agent", c.Where(), c.Key)
		case "notify_up", "notify_down", "smtp_alert", "snmp_name", "lthreshold", "warmup":
			res.note(c, "no effect in xlb")
		default:
			return b, nil, false, fmt.Errorf("%s: %s in a real_server is not imported (xlb has no equivalent)", c.Where(), c.Key)
		}
	}
	if checker == nil {
		return b, nil, opts.inhibit != nil && *opts.inhibit, nil
	}
	chk, inhibit, err := convertChecker(checker, b, opts, res)
	return b, chk, inhibit, err
}

// convertChecker makes the backend's check. keepalived's timing becomes
// xlb's: a failed check of a live server is retried `retry` times
// `delay_before_retry` apart before it goes down (fall retry+1, fastinter
// delay_before_retry), one success brings it up (rise 1), checks come
// every delay_loop, and `alpha` starts it down.
func convertChecker(c *Node, b model.Backend, opts checkerOpts, res *Result) (*model.Check, bool, error) {
	chk := &model.Check{}
	var urls []*Node
	var miscPath string
	miscDynamic := false
	var miscTimeout *time.Duration
	for _, o := range c.Children {
		var co checkerOpts
		ok, err := co.set(o)
		if err != nil {
			return nil, false, err
		}
		if ok {
			opts = opts.over(co)
			continue
		}
		switch o.Key {
		case "connect_port":
			p, err := strconv.ParseUint(arg(o), 10, 16)
			if err != nil || p == 0 {
				return nil, false, fmt.Errorf("%s: connect_port %q: want 1 to 65535", o.Where(), arg(o))
			}
			chk.Port = uint16(p)
		case "connect_ip":
			a, err := netip.ParseAddr(arg(o))
			if err != nil || a.Unmap() != b.Addr {
				return nil, false, fmt.Errorf("%s: connect_ip %s: xlb checks a backend at its own address (%s)", o.Where(), arg(o), b.Addr)
			}
		case "bindto":
			a, err := netip.ParseAddr(arg(o))
			if err != nil {
				return nil, false, fmt.Errorf("%s: bindto %q: not an IP address", o.Where(), arg(o))
			}
			chk.SourceAddr = a.Unmap()
		case "url":
			urls = append(urls, o)
		case "misc_path":
			miscPath = arg(o)
		case "misc_timeout":
			d, err := timer(o)
			if err != nil {
				return nil, false, err
			}
			miscTimeout = &d
		case "misc_dynamic":
			miscDynamic = true
		case "payload":
			h, err := hexArg(o)
			if err != nil {
				return nil, false, err
			}
			chk.Send = "hex:" + h
		case "require_reply":
			if len(o.Args) > 0 {
				h, err := hexArg(o)
				if err != nil {
					return nil, false, err
				}
				chk.Expect = "hex:" + h
			}
		case "enable_sni", "http_protocol", "fast_recovery", "log_all_failures", "user", "warmup", "bind_if", "min_reply_length", "max_reply_length":
			res.note(o, "no effect in xlb")
		default:
			return nil, false, fmt.Errorf("%s: %s in %s is not imported (xlb has no equivalent)", o.Where(), o.Key, c.Key)
		}
	}
	retry, delayRetry := defaultRetry, defaultDelayRetry
	switch c.Key {
	case "TCP_CHECK":
		chk.Type = model.CheckTCP
	case "UDP_CHECK":
		chk.Type = model.CheckUDP
	case "HTTP_GET", "SSL_GET":
		chk.Type = model.CheckHTTP
		if c.Key == "SSL_GET" {
			chk.Type = model.CheckHTTPS
		}
		delayRetry = defaultDelayRetryHTTP
		if err := setURL(chk, c, urls); err != nil {
			return nil, false, err
		}
		if opts.virtualhost != nil {
			chk.Host = *opts.virtualhost
		}
	case "MISC_CHECK":
		chk.Type = model.CheckExec
		retry = defaultRetryMisc
		if miscPath == "" {
			return nil, false, fmt.Errorf("%s: MISC_CHECK without misc_path", c.Where())
		}
		chk.Command = miscPath
		if miscDynamic {
			// keepalived reads a weight from the exit status (2-255:
			// up, weight status-2); xlb's exec check from a stdout
			// line "weight N".
			chk.Command = `rc=0; (` + miscPath + `) || rc=$?; if [ "$rc" -ge 2 ]; then echo "weight $((rc - 2))"; exit 0; fi; exit "$rc"`
		}
	}
	if opts.retry != nil {
		retry = *opts.retry
	}
	if opts.delayRetry != nil {
		delayRetry = *opts.delayRetry
	}
	chk.Inter = defaultDelayLoop
	if opts.delayLoop != nil {
		chk.Inter = *opts.delayLoop
	}
	chk.Timeout = defaultConnectTimeout
	if opts.connectTimeout != nil {
		chk.Timeout = *opts.connectTimeout
	}
	if c.Key == "MISC_CHECK" {
		// misc_timeout, else keepalived gives the script delay_loop.
		chk.Timeout = chk.Inter
		if miscTimeout != nil {
			chk.Timeout = *miscTimeout
		}
	}
	chk.Rise, chk.Fall = 1, uint32(retry)+1
	if retry > 0 {
		chk.FastInter = delayRetry
	}
	if opts.alpha != nil && *opts.alpha {
		chk.InitState = model.InitDown
	}
	return chk, opts.inhibit != nil && *opts.inhibit, nil
}

// setURL takes HTTP_GET's one url block: path, status_code, digest,
// regex, virtualhost.
func setURL(chk *model.Check, c *Node, urls []*Node) error {
	if len(urls) == 0 {
		return fmt.Errorf("%s: %s without a url block", c.Where(), c.Key)
	}
	if len(urls) > 1 {
		return fmt.Errorf("%s: %s with %d url blocks: xlb checks one path per backend", urls[1].Where(), c.Key, len(urls))
	}
	chk.Method, chk.Status = "GET", slices.Clone(defaultStatus)
	for _, u := range urls[0].Children {
		switch u.Key {
		case "path":
			chk.Path = arg(u)
		case "digest":
			chk.BodyDigest = strings.ToLower(arg(u))
		case "status_code":
			rs, err := model.ParseStatusRanges(strings.Join(u.Args, ","))
			if err != nil {
				return fmt.Errorf("%s: status_code %s: %w", u.Where(), strings.Join(u.Args, " "), err)
			}
			chk.Status = rs
		case "regex":
			chk.BodyRegex = arg(u)
		case "virtualhost":
			chk.Host = arg(u)
		case "regex_no_match", "regex_options", "regex_stack", "regex_min_offset", "regex_max_offset":
			return fmt.Errorf("%s: %s is not imported: xlb's body regex must match, over the whole body, with Go's syntax", u.Where(), u.Key)
		default:
			return fmt.Errorf("%s: %s in url is not imported (xlb has no equivalent)", u.Where(), u.Key)
		}
	}
	if chk.Path == "" {
		chk.Path = "/"
	}
	return nil
}

// hexArg reads UDP_CHECK's free-form hex: its digits in pairs, a lone
// digit of a group as its low half (keepalived's "Ab12f 3" is AB 12 0F 03).
func hexArg(c *Node) (string, error) {
	var out strings.Builder
	for _, g := range c.Args {
		g = strings.ToLower(g)
		if len(g)%2 == 1 {
			g = g[:len(g)-1] + "0" + g[len(g)-1:]
		}
		for _, r := range g {
			if !strings.ContainsRune("0123456789abcdef", r) {
				return "", fmt.Errorf("%s: %s %q: hexadecimal digits only (xlb has no wildcard nibbles)", c.Where(), c.Key, strings.Join(c.Args, " "))
			}
		}
		out.WriteString(g)
	}
	return out.String(), nil
}

// farmChecks puts the backends' checks in the farm: the first checked
// backend's as the farm's, others that differ as their own, and "none"
// for the unchecked. inhibit_on_failure must be the same for all (xlb's
// inhibit is per farm).
func farmChecks(f *model.Farm, n *Node, checks []*model.Check, inhibits []bool) error {
	var first *model.Check
	for _, c := range checks {
		if c != nil {
			first = c
			break
		}
	}
	if first == nil {
		return nil
	}
	for i := range inhibits {
		if inhibits[i] != inhibits[0] {
			return fmt.Errorf("%s: inhibit_on_failure is set for some real servers only: xlb's inhibit is per farm", n.Where())
		}
	}
	fc := *first
	fc.Inhibit = inhibits[0]
	f.Check = &fc
	for i, c := range checks {
		switch {
		case c == nil:
			f.Backends[i].Check = &model.Check{Type: model.CheckNone}
		case !sameCheck(c, first):
			f.Backends[i].Check = c
		}
	}
	return nil
}

func sameCheck(a, b *model.Check) bool {
	x, y := *a, *b
	return x.Type == y.Type && x.Port == y.Port && x.SourceAddr == y.SourceAddr && x.Inter == y.Inter &&
		x.FastInter == y.FastInter && x.Timeout == y.Timeout && x.Rise == y.Rise && x.Fall == y.Fall &&
		x.Method == y.Method && x.Path == y.Path && x.Host == y.Host && slices.Equal(x.Status, y.Status) &&
		x.BodyRegex == y.BodyRegex && x.BodyDigest == y.BodyDigest && x.Send == y.Send && x.Expect == y.Expect &&
		x.Command == y.Command && x.InitState == y.InitState
}

// setQuorum: keepalived's quorum and hysteresis count the weight of the
// live real servers, xlb's the backends up; they agree when every weight
// is the same (w: quorum q is ceil(q/w) backends).
func setQuorum(f *model.Farm, n *Node, quorum, hysteresis *uint32) error {
	if quorum == nil && hysteresis == nil {
		return nil
	}
	if f.Check == nil {
		return fmt.Errorf("%s: quorum or hysteresis without checkers: no real server ever goes down", n.Where())
	}
	w := uint32(0)
	for _, b := range f.Backends {
		if w != 0 && b.Weight != w {
			return fmt.Errorf("%s: quorum and hysteresis count weight in keepalived and backends in xlb: with real servers of different weights, set the farm's check quorum by hand", n.Where())
		}
		w = b.Weight
	}
	if w == 0 {
		w = 1
	}
	if quorum != nil {
		f.Check.Quorum = (*quorum + w - 1) / w
	}
	if hysteresis != nil {
		f.Check.Hysteresis = *hysteresis / w
	}
	return nil
}

// addSorry adds the sorry server as a backend the farm's check names: it
// serves alone while the quorum is lost (keepalived: "all real servers
// will be brought down ... and replaced with the sorry server").
func addSorry(f *model.Farm, c *Node) error {
	if f.Check == nil {
		return fmt.Errorf("%s: sorry_server without checkers: no real server ever goes down", c.Where())
	}
	if len(c.Args) < 1 || len(c.Args) > 2 {
		return fmt.Errorf("%s: sorry_server takes ADDRESS [PORT]", c.Where())
	}
	a, err := netip.ParseAddr(c.Args[0])
	if err != nil {
		return fmt.Errorf("%s: sorry_server %q: not an IP address", c.Where(), c.Args[0])
	}
	b := model.NewBackend("sorry-server")
	b.Addr = a.Unmap()
	if len(c.Args) == 2 && f.Mode != model.ModeDSR {
		p, err := strconv.ParseUint(c.Args[1], 10, 16)
		if err != nil {
			return fmt.Errorf("%s: sorry_server port %q: want 0 to 65535", c.Where(), c.Args[1])
		}
		b.Port = uint16(p)
	}
	f.Backends = append(f.Backends, b)
	f.Check.SorryServer = b.Name
	return nil
}
