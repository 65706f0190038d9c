// Package bgp announces xlb's virtual addresses to the user's routers over
// BGP, with GoBGP embedded as a library (no BGP code of our own). A VIP is
// announced only while a farm on it is in the kernel (and, with connection
// sync on, once the node has caught up with its peers), and withdrawn when
// its farms are deleted, when every backend of a farm that asks for it is
// unhealthy, and first of all on a graceful stop. When the daemon dies its
// TCP sessions close (or, if the whole node is gone, the hold timer runs
// out) and the routers withdraw its routes themselves.
//
// The speaker only ever talks to routers; it never touches the data plane,
// so a router that flaps changes routes and nothing else.
package bgp

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Config is the speaker's configuration (the daemon's --bgp-config file,
// YAML). See docs/ha.md for an example.
type Config struct {
	// RouterID is the BGP identifier (an IPv4 address; required).
	RouterID netip.Addr
	// AS is the local AS number (required).
	AS uint32
	// Peers are the routers to announce to.
	Peers []Peer
	// HoldTime is proposed to every peer (3s to 65535s; default 9s). The
	// router withdraws a node whose sessions went silent this long.
	HoldTime time.Duration
	// DrainWait is how long a graceful stop waits after withdrawing every
	// route before it closes the sessions (default 2s): long enough for
	// the routers to move new flows elsewhere.
	DrainWait time.Duration
	// NextHop4 and NextHop6 are the next hops announced (default: the
	// session's local address for IPv4; for IPv6, required to announce
	// IPv6 VIPs over IPv4 sessions).
	NextHop4, NextHop6 netip.Addr
	// Default are the attributes of every VIP; Farms override them for the
	// VIPs of one farm.
	Default Attrs
	Farms   map[string]Attrs
}

// Peer is one router.
type Peer struct {
	Address netip.Addr
	AS      uint32
	Port    uint16 // default 179
	// Password turns on TCP MD5 signatures (RFC 2385) for the session.
	Password string
	// LocalAddress is the source of the session (default: the kernel's
	// choice).
	LocalAddress netip.Addr
}

// Attrs are the path attributes of a VIP's route and when it is
// announced.
type Attrs struct {
	// Communities are RFC 1997 communities, "ASN:VALUE".
	Communities []Community
	// MED, if set, is the MULTI_EXIT_DISC: a router prefers the lowest
	// among routes from the same AS (active-backup with eBGP).
	MED *uint32
	// LocalPref, if set, is the LOCAL_PREF (active-backup with iBGP: the
	// highest wins).
	LocalPref *uint32
	// WithdrawWhenDown withdraws the farm's VIPs while no backend of it
	// serves (every one down by its health checks, or off).
	WithdrawWhenDown bool
	// Announce false keeps the farm's VIPs unannounced (default true).
	Announce *bool
}

// Community is an RFC 1997 community.
type Community uint32

func (c Community) String() string { return fmt.Sprintf("%d:%d", c>>16, c&0xffff) }

// ParseCommunity parses "ASN:VALUE" (each 0-65535).
func ParseCommunity(s string) (Community, error) {
	a, v, ok := strings.Cut(s, ":")
	hi, err1 := strconv.ParseUint(a, 10, 16)
	lo, err2 := strconv.ParseUint(v, 10, 16)
	if !ok || err1 != nil || err2 != nil {
		return 0, fmt.Errorf("community %q: must be ASN:VALUE, each 0-65535", s)
	}
	return Community(hi<<16 | lo), nil
}

// The file's shape: every key spelled as in docs/ha.md, unknown keys are
// errors.
type fileConfig struct {
	RouterID  string               `yaml:"router-id"`
	AS        uint32               `yaml:"as"`
	HoldTime  string               `yaml:"hold-time"`
	DrainWait string               `yaml:"drain-wait"`
	NextHop4  string               `yaml:"next-hop-ipv4"`
	NextHop6  string               `yaml:"next-hop-ipv6"`
	Peers     []filePeer           `yaml:"peers"`
	Default   fileAttrs            `yaml:"announce"`
	Farms     map[string]fileAttrs `yaml:"farms"`
}

type filePeer struct {
	Address      string `yaml:"address"`
	AS           uint32 `yaml:"as"`
	Port         uint16 `yaml:"port"`
	Password     string `yaml:"password"`
	PasswordFile string `yaml:"password-file"`
	LocalAddress string `yaml:"local-address"`
}

type fileAttrs struct {
	Communities      []string `yaml:"communities"`
	MED              *uint32  `yaml:"med"`
	LocalPref        *uint32  `yaml:"local-pref"`
	WithdrawWhenDown bool     `yaml:"withdraw-when-down"`
	Announce         *bool    `yaml:"announce"`
}

// Defaults.
const (
	DefaultHoldTime  = 9 * time.Second
	DefaultDrainWait = 2 * time.Second
)

var farmNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// LoadConfig reads and checks a --bgp-config file.
func LoadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read BGP config: %w", err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		return nil, fmt.Errorf("BGP config %s: %w", path, err)
	}
	return c, nil
}

// ParseConfig decodes and checks a BGP configuration. Every error names the
// key and the value and says what is allowed.
func ParseConfig(b []byte) (*Config, error) {
	var fc fileConfig
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&fc); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	c := &Config{AS: fc.AS, HoldTime: DefaultHoldTime, DrainWait: DefaultDrainWait}
	var err error
	if c.RouterID, err = netip.ParseAddr(fc.RouterID); err != nil || !c.RouterID.Is4() {
		return nil, fmt.Errorf("router-id %q: must be an IPv4 address", fc.RouterID)
	}
	if c.AS == 0 {
		return nil, errors.New("as: required, 1-4294967295")
	}
	if fc.HoldTime != "" {
		if c.HoldTime, err = time.ParseDuration(fc.HoldTime); err != nil || c.HoldTime < 3*time.Second || c.HoldTime > 65535*time.Second || c.HoldTime%time.Second != 0 {
			return nil, fmt.Errorf("hold-time %q: must be whole seconds from 3s to 65535s", fc.HoldTime)
		}
	}
	if fc.DrainWait != "" {
		if c.DrainWait, err = time.ParseDuration(fc.DrainWait); err != nil || c.DrainWait < 0 || c.DrainWait > 10*time.Minute {
			return nil, fmt.Errorf("drain-wait %q: must be a duration from 0s to 10m", fc.DrainWait)
		}
	}
	if fc.NextHop4 != "" {
		if c.NextHop4, err = netip.ParseAddr(fc.NextHop4); err != nil || !c.NextHop4.Is4() {
			return nil, fmt.Errorf("next-hop-ipv4 %q: must be an IPv4 address", fc.NextHop4)
		}
	}
	if fc.NextHop6 != "" {
		if c.NextHop6, err = netip.ParseAddr(fc.NextHop6); err != nil || !c.NextHop6.Is6() || c.NextHop6.Is4In6() {
			return nil, fmt.Errorf("next-hop-ipv6 %q: must be an IPv6 address", fc.NextHop6)
		}
	}
	if len(fc.Peers) == 0 {
		return nil, errors.New("peers: at least one peer is required")
	}
	for i, fp := range fc.Peers {
		p, err := fp.parse()
		if err != nil {
			return nil, fmt.Errorf("peers[%d]: %w", i, err)
		}
		if slices.ContainsFunc(c.Peers, func(q Peer) bool { return q.Address == p.Address }) {
			return nil, fmt.Errorf("peers[%d]: address %s: listed twice", i, p.Address)
		}
		c.Peers = append(c.Peers, p)
	}
	if c.Default, err = fc.Default.parse(); err != nil {
		return nil, fmt.Errorf("announce: %w", err)
	}
	for name, fa := range fc.Farms {
		if !farmNameRE.MatchString(name) {
			return nil, fmt.Errorf("farms: name %q: not a farm name", name)
		}
		a, err := fa.parse()
		if err != nil {
			return nil, fmt.Errorf("farms.%s: %w", name, err)
		}
		if c.Farms == nil {
			c.Farms = map[string]Attrs{}
		}
		c.Farms[name] = a
	}
	return c, nil
}

func (fp filePeer) parse() (Peer, error) {
	p := Peer{AS: fp.AS, Port: fp.Port, Password: fp.Password}
	var err error
	if p.Address, err = netip.ParseAddr(fp.Address); err != nil {
		return p, fmt.Errorf("address %q: must be an IP address", fp.Address)
	}
	p.Address = p.Address.Unmap()
	if p.AS == 0 {
		return p, errors.New("as: required, 1-4294967295")
	}
	if p.Port == 0 {
		p.Port = 179
	}
	if fp.PasswordFile != "" {
		if fp.Password != "" {
			return p, errors.New("password and password-file: give one of them")
		}
		b, err := os.ReadFile(fp.PasswordFile)
		if err != nil {
			return p, fmt.Errorf("password-file: %w", err)
		}
		p.Password = strings.TrimSpace(string(b))
	}
	if len(p.Password) > 80 {
		return p, errors.New("password: at most 80 bytes (TCP MD5 key)")
	}
	if fp.LocalAddress != "" {
		if p.LocalAddress, err = netip.ParseAddr(fp.LocalAddress); err != nil || p.LocalAddress.Is4() != p.Address.Is4() {
			return p, fmt.Errorf("local-address %q: must be an IP address of the peer's family", fp.LocalAddress)
		}
	}
	return p, nil
}

func (fa fileAttrs) parse() (Attrs, error) {
	a := Attrs{MED: fa.MED, LocalPref: fa.LocalPref, WithdrawWhenDown: fa.WithdrawWhenDown, Announce: fa.Announce}
	for _, s := range fa.Communities {
		c, err := ParseCommunity(s)
		if err != nil {
			return a, fmt.Errorf("communities: %w", err)
		}
		a.Communities = append(a.Communities, c)
	}
	return a, nil
}

// attrsFor returns the attributes of a farm's VIPs: the farm's own over the
// defaults, key by key.
func (c *Config) attrsFor(farm string) Attrs {
	a := c.Default
	o, ok := c.Farms[farm]
	if !ok {
		return a
	}
	if o.Communities != nil {
		a.Communities = o.Communities
	}
	if o.MED != nil {
		a.MED = o.MED
	}
	if o.LocalPref != nil {
		a.LocalPref = o.LocalPref
	}
	if o.Announce != nil {
		a.Announce = o.Announce
	}
	a.WithdrawWhenDown = a.WithdrawWhenDown || o.WithdrawWhenDown
	return a
}

// withdrawWhenDown reports whether any farm's VIPs follow its health.
func (c *Config) withdrawWhenDown() bool {
	if c.Default.WithdrawWhenDown {
		return true
	}
	for _, a := range c.Farms {
		if a.WithdrawWhenDown {
			return true
		}
	}
	return false
}
