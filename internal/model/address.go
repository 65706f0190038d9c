package model

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
)

// Address is nftlb's address object: where a farm listens (an IP address,
// ports and a protocol). In nftlb 1.0 a farm's virtual-addr, virtual-ports,
// protocol and family are its first address, named "<farm>-addr" unless
// given another name; GET /farms lists it under "addresses", and
// GET /addresses lists every farm's addresses.
//
// xlb keeps an address with the farms that use it: the farm's own address
// is its VirtualAddr, VirtualPorts, Protocol and Family (named by
// AddrName), and further addresses are Farm.Addresses (the nft plane serves
// them as nftlb does: every address's keys lead to the farm's one chain;
// Listeners). An address no farm uses is kept by the engine on its own
// (engine: unused addresses) until a farm names it.
type Address struct {
	Name     string
	Family   Family
	Addr     netip.Addr // invalid: none given
	Addr2    netip.Addr // family dual: the address of the other family
	Ports    []PortRange
	Protocol Protocol
}

// OwnAddressName is the name of the farm's own address.
func (f *Farm) OwnAddressName() string {
	if f.AddrName != "" {
		return f.AddrName
	}
	return f.Name + "-addr"
}

// HasOwnAddress reports whether the farm has an address of its own: a
// virtual-addr, or an address given in "addresses".
func (f *Farm) HasOwnAddress() bool { return f.VirtualAddr.IsValid() || f.AddrName != "" }

// OwnAddress returns the farm's own address as an Address.
func (f *Farm) OwnAddress() Address {
	return Address{Name: f.OwnAddressName(), Family: f.Family, Addr: f.VirtualAddr, Addr2: f.VirtualAddr2, Ports: f.VirtualPorts, Protocol: f.Protocol}
}

// Listens reports whether the data plane has anything to program for the
// farm: a virtual address or a firewall mark. A farm without either (nftlb
// keeps such a farm, e.g. one whose backends arrived before its address) is
// kept in the configuration and serves nothing.
func (f *Farm) Listens() bool { return f.VirtualAddr.IsValid() || f.Mark != 0 }

// AllAddresses returns the farm's own address (if any) and its further
// addresses.
func (f *Farm) AllAddresses() []Address {
	var out []Address
	if f.HasOwnAddress() {
		out = append(out, f.OwnAddress())
	}
	return append(out, f.Addresses...)
}

// Listener is one thing a farm listens on, as the data planes key it: an
// IP address, a protocol and ports (none: every port).
type Listener struct {
	Addr     netip.Addr
	Protocol Protocol
	Ports    []PortRange
}

// Listeners returns what the farm listens on: each VIP of its own address
// (two for family dual), then each further address that has an IP (nftlb
// programs every address of a farm into its service maps, all going to the
// farm's one chain). A firewall-mark farm has none.
func (f *Farm) Listeners() []Listener {
	vips := f.VirtualAddrs()
	out := make([]Listener, 0, len(vips)+len(f.Addresses))
	for _, v := range vips {
		out = append(out, Listener{Addr: v, Protocol: f.Protocol, Ports: f.VirtualPorts})
	}
	for _, a := range f.Addresses {
		if a.Addr.IsValid() {
			out = append(out, Listener{Addr: a.Addr, Protocol: a.Protocol, Ports: a.Ports})
		}
	}
	return out
}

// SinglePort reports whether the farm listens on one port only: its own
// address has one port and it has no further address. A backend of port 0
// (the client's port) is then the same as one of that port.
func (f *Farm) SinglePort() bool {
	return len(f.Addresses) == 0 && len(f.VirtualPorts) == 1 && f.VirtualPorts[0].First == f.VirtualPorts[0].Last
}

// AddressLookup finds an address of that name among the farms (for a farm
// body that names an address without giving its values).
type AddressLookup func(name string) (Address, bool)

// addressFields are the members of an address object: "used" is printed
// (read-only), and verdict, log-prefix, log-rtlimit and policies are
// accepted at nftlb's defaults only.
var addressFields = []scalarField[Address]{
	{name: "name"},
	enumField("family", familySpec, func(a *Address) *Family { return &a.Family }),
	{
		// As a farm's virtual-addr: one address, or (family dual) one of
		// each family separated by a comma.
		name: "ip-addr",
		decode: func(a *Address, v string) error {
			if strings.TrimSpace(v) == "" {
				// nftlb: "Key 'ip-addr' cannot be empty".
				return fmt.Errorf("cannot be empty: an address needs an IP address")
			}
			var f Farm
			if err := farmFields[fieldIndex(farmFields, "virtual-addr")].decode(&f, v); err != nil {
				return err
			}
			a.Addr, a.Addr2 = f.VirtualAddr, f.VirtualAddr2
			return nil
		},
	},
	{
		name: "ports",
		decode: func(a *Address, v string) error {
			ps, err := ParsePorts(v)
			if err != nil {
				return err
			}
			a.Ports = ps
			return nil
		},
	},
	enumField("protocol", protocolSpec, func(a *Address) *Protocol { return &a.Protocol }),
	{name: "used", decode: func(*Address, string) error { return nil }},
	{name: "verdict", decode: func(a *Address, v string) error {
		if x, ok := verdictSpec.parse(v); strings.TrimSpace(v) != "" && (!ok || x != DefaultVerdict) {
			return fmt.Errorf("an address's own verdict is not implemented yet; only nftlb's default \"log drop accept\" is accepted")
		}
		return nil
	}},
	{name: "log-prefix", decode: func(a *Address, v string) error {
		if v != "" {
			return fmt.Errorf("an address's own log prefix is not implemented yet; leave it empty")
		}
		return nil
	}},
	{name: "log-rtlimit", decode: func(a *Address, v string) error {
		n, _, err := parseRate(v, 1<<31-1)
		if err != nil {
			return err
		}
		if n != 0 {
			return fmt.Errorf("an address's own log-rtlimit is not implemented yet; only 0/second is accepted")
		}
		return nil
	}},
}

// decodeAddressObject decodes the address object at tape index obj onto a.
// Policies of an address (nftlb's address policies) are issue 17's named
// tables: only an empty list is accepted.
func decodeAddressObject(d *doc, obj int, owner string, a *Address) error {
	label := fmt.Sprintf("address %q", a.Name)
	if owner != "" {
		label = fmt.Sprintf("farm %q address %q", owner, a.Name)
	}
	for k, end := d.children(obj); k < end; k = d.toks[k+1].next {
		key, v := d.key(k), k+1
		switch key {
		case "name":
			continue
		case "policies":
			if kind := d.toks[v].kind; kind == 'n' || kind == '[' && d.toks[v].next == v+1 {
				continue
			}
			return &FieldError{Object: label, Field: "policies", Problem: "policies of an address are not implemented yet (named tables); only an empty list is accepted"}
		}
		i := fieldIndex(addressFields, key)
		if i < 0 {
			return &FieldError{Object: label, Field: strings.Clone(clip(key)), Problem: "unknown field; known fields are " + fieldNames(addressFields) + ", policies", UnknownField: true}
		}
		text, ok := d.scalar(v)
		if !ok {
			return fieldError(label, key, truncate(d.raw(v)), "must be a string, number or boolean")
		}
		if err := addressFields[i].decode(a, text); err != nil {
			return fieldError(label, key, text, err.Error())
		}
	}
	return nil
}

// decodeFarmAddresses applies the farm body's "addresses" (value as): each
// object is the farm's own address (when it has its name, or is the first
// and the farm has none yet) or a further address, created or patched by
// name. An object with only a name that the farm does not have takes the
// values of the address of that name that lookup finds.
func decodeFarmAddresses(f *Farm, d *doc, as int, lookup AddressLookup) error {
	bad := func(problem string) error {
		return &FieldError{Object: farmObject(f.Name), Field: "addresses", Problem: problem}
	}
	switch d.toks[as].kind {
	case 'n':
		return nil
	case '[':
	default:
		return bad("must be an array of address objects")
	}
	for e, end := d.children(as); e < end; e = d.toks[e].next {
		if d.toks[e].kind != '{' {
			return bad("must be an array of address objects")
		}
	}
	for i, e, end := 0, 0, 0; ; i++ {
		if i == 0 {
			e, end = d.children(as)
		} else {
			e = d.toks[e].next
		}
		if e >= end {
			break
		}
		nameText, ok := d.scalar(d.lastMember(e, "name"))
		if !ok || !ValidName(nameText) {
			return fieldError(farmObject(f.Name), fmt.Sprintf("addresses[%d].name", i), nameText, "is required and must be "+nameRule)
		}
		name := strings.Clone(nameText)
		own := name == f.OwnAddressName() || !f.HasOwnAddress() && i == 0
		if !own && i == 0 && !onlyName(d, e) {
			// nftlb lists a farm's own address first, with the farm's
			// virtual-addr: a first object with the same values is the
			// own address under another name (its GET output posted back).
			a := f.OwnAddress()
			a.Name = name
			if err := decodeAddressObject(d, e, f.Name, &a); err != nil {
				return err
			}
			own = a.sameListener(f.OwnAddress())
		}
		var a Address
		idx := -1
		switch {
		case own:
			a = f.OwnAddress()
			a.Name = name
		default:
			for j := range f.Addresses {
				if f.Addresses[j].Name == name {
					idx, a = j, f.Addresses[j]
				}
			}
			if idx < 0 {
				a = Address{Name: name, Family: f.Family, Protocol: f.Protocol}
			}
		}
		if onlyName(d, e) && (own && !f.HasOwnAddress() || !own && idx < 0) {
			found, ok := Address{}, false
			if lookup != nil {
				found, ok = lookup(name)
			}
			if !ok {
				return &FieldError{Object: farmObject(f.Name), Field: "addresses", Value: name,
					Problem: "no farm has an address of that name; give its ip-addr, ports and protocol (xlb keeps an address with the farms that use it)"}
			}
			a = found
		}
		if err := decodeAddressObject(d, e, f.Name, &a); err != nil {
			return err
		}
		if own {
			f.VirtualAddr, f.VirtualAddr2 = a.Addr, a.Addr2
			f.VirtualPorts, f.Protocol, f.Family = a.Ports, a.Protocol, a.Family
			f.AddrName = a.Name
			if f.AddrName == f.Name+"-addr" && f.VirtualAddr.IsValid() {
				f.AddrName = "" // the default name
			}
			continue
		}
		if idx < 0 {
			f.Addresses = append(f.Addresses, a)
		} else {
			f.Addresses[idx] = a
		}
	}
	return nil
}

// sameListener reports whether two addresses have the same family,
// addresses, ports and protocol.
func (a Address) sameListener(b Address) bool {
	return a.Family == b.Family && a.Addr == b.Addr && a.Addr2 == b.Addr2 && a.Protocol == b.Protocol &&
		formatPorts(a.Ports) == formatPorts(b.Ports)
}

// onlyName reports whether the object at e has no member but "name" (and
// the read-only "used").
func onlyName(d *doc, e int) bool {
	for k, end := d.children(e); k < end; k = d.toks[k+1].next {
		if key := d.key(k); key != "name" && key != "used" {
			return false
		}
	}
	return true
}

// validateAddresses checks the farm's further addresses.
func (f *Farm) validateAddresses() error {
	seen := map[string]bool{f.OwnAddressName(): f.HasOwnAddress()}
	for _, a := range f.Addresses {
		label := fmt.Sprintf("farm %q address %q", f.Name, a.Name)
		if !ValidName(a.Name) {
			return &FieldError{Object: farmObject(f.Name), Field: "addresses.name", Value: a.Name, Problem: "must be " + nameRule}
		}
		if seen[a.Name] {
			return &FieldError{Object: label, Field: "name", Value: a.Name, Problem: "address names must be unique in a farm"}
		}
		seen[a.Name] = true
		if err := a.validate(label); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks an address object on its own (one no farm uses).
func (a Address) Validate() error {
	label := fmt.Sprintf("address %q", a.Name)
	if !ValidName(a.Name) {
		return &FieldError{Object: label, Field: "name", Value: a.Name, Problem: "must be " + nameRule}
	}
	return a.validate(label)
}

func (a Address) validate(label string) error {
	if a.Addr.IsValid() && a.Family != FamilyDual && a.Addr.Is4() != (a.Family == FamilyIPv4) {
		return &FieldError{Object: label, Field: "ip-addr", Value: a.Addr.String(), Problem: "does not match the address's family " + a.Family.String()}
	}
	if a.Addr.IsValid() && (a.Addr.Zone() != "" || a.Addr.Is4In6()) {
		return &FieldError{Object: label, Field: "ip-addr", Value: a.Addr.String(), Problem: "must be a plain IPv4 or IPv6 address"}
	}
	return nil
}

// appendAddressesJSON appends the farm's "addresses" array as nftlb's GET
// /farms prints it: name, family, ip-addr, ports, protocol, used.
func (f *Farm) appendAddressesJSON(dst []byte) []byte {
	dst = append(dst, '[')
	for i, a := range f.AllAddresses() {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = a.appendJSON(dst, 1, false)
	}
	return append(dst, ']')
}

// appendJSON appends the address object. full adds what GET /addresses
// prints beyond a farm's list: verdict, log-rtlimit and policies.
func (a *Address) appendJSON(dst []byte, used int, full bool) []byte {
	dst = append(dst, `{"name":`...)
	dst = appendJSONString(dst, a.Name)
	dst = append(dst, `,"family":`...)
	dst = appendJSONString(dst, a.Family.String())
	dst = append(dst, `,"ip-addr":"`...)
	start := len(dst) - 1
	dst = appendAddr(dst, a.Addr)
	if a.Addr.IsValid() && a.Addr2.IsValid() {
		dst = appendAddr(append(dst, ','), a.Addr2)
	}
	dst = closeJSONString(dst, start)
	dst = append(dst, `,"ports":"`...)
	dst = append(appendPorts(dst, a.Ports), '"')
	dst = append(dst, `,"protocol":`...)
	dst = appendJSONString(dst, a.Protocol.String())
	if full {
		dst = append(dst, `,"verdict":"log drop accept","log-rtlimit":"0/second"`...)
	}
	dst = append(dst, `,"used":`...)
	dst = appendQuotedUint(dst, "", uint64(used), 10)
	if full {
		dst = append(dst, `,"policies":[]`...)
	}
	return append(dst, '}')
}

// AppendAddressesJSON writes nftlb's {"addresses":[...]}: each address
// with the number of farms that use it.
func AppendAddressesJSON(dst []byte, addrs []Address, used []int) []byte {
	dst = append(dst, `{"addresses":[`...)
	for i := range addrs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = addrs[i].appendJSON(dst, used[i], true)
	}
	return append(dst, "]}\n"...)
}

// DecodeAddresses decodes nftlb's {"addresses":[...]} body (or one address
// object). Each object is patched onto the address of that name current
// returns, if any. Addresses are checked on their own; what they mean for
// the farms that use them is checked when those farms are.
func DecodeAddresses(body []byte, current AddressLookup) ([]Address, error) {
	d, ok := scanDoc(body)
	defer d.release()
	if !ok || d.toks[0].kind != '{' {
		return nil, &StructureError{Msg: "request body is not a JSON object"}
	}
	first, end := 0, d.toks[0].next
	if as := d.lastMember(0, "addresses"); as >= 0 {
		for k, e := d.children(0); k < e; k = d.toks[k+1].next {
			if d.key(k) != "addresses" {
				return nil, &FieldError{Field: strings.Clone(clip(d.key(k))), Problem: "unknown top-level field; the body is {\"addresses\": [...]}", UnknownField: true}
			}
		}
		if d.toks[as].kind != '[' {
			return nil, &StructureError{Msg: "field \"addresses\" must be an array of address objects"}
		}
		first, end = d.children(as)
	}
	var out []Address
	seen := map[string]bool{}
	for i, e := 0, first; e < end; i, e = i+1, d.toks[e].next {
		if d.toks[e].kind != '{' {
			return nil, &StructureError{Msg: fmt.Sprintf("addresses[%d] must be a JSON object", i)}
		}
		nameText, ok := d.scalar(d.lastMember(e, "name"))
		if !ok || !ValidName(nameText) {
			return nil, &MissingNameError{What: fmt.Sprintf("addresses[%d]", i)}
		}
		name := strings.Clone(nameText)
		a, exists := current(name)
		if !exists {
			a = Address{Name: name, Family: FamilyIPv4, Protocol: ProtoTCP}
		}
		a.Ports = append([]PortRange(nil), a.Ports...)
		if err := decodeAddressObject(&d, e, "", &a); err != nil {
			return nil, err
		}
		if seen[name] {
			return nil, &FieldError{Field: "addresses", Value: name, Problem: "the same address appears twice in one request"}
		}
		seen[name] = true
		out = append(out, a)
	}
	return out, nil
}

// SetAddress gives the farm's address of that name (its own or a further
// one) the values of a; it reports whether the farm has it.
func (f *Farm) SetAddress(a Address) bool {
	if f.HasOwnAddress() && f.OwnAddressName() == a.Name {
		f.VirtualAddr, f.VirtualAddr2 = a.Addr, a.Addr2
		f.VirtualPorts, f.Protocol, f.Family = a.Ports, a.Protocol, a.Family
		return true
	}
	for i := range f.Addresses {
		if f.Addresses[i].Name == a.Name {
			f.Addresses[i] = a
			return true
		}
	}
	return false
}

// RemoveAddress removes the farm's address of that name; it reports whether
// the farm had it. When the farm's own address goes, its next address
// becomes its own (nftlb prints a farm's first address as its
// virtual-addr); without one the farm listens nowhere, as in nftlb.
func (f *Farm) RemoveAddress(name string) bool {
	if f.HasOwnAddress() && f.OwnAddressName() == name {
		f.VirtualAddr, f.VirtualAddr2, f.VirtualPorts, f.AddrName = netip.Addr{}, netip.Addr{}, nil, ""
		if len(f.Addresses) > 0 {
			next := f.Addresses[0]
			f.Addresses = f.Addresses[1:]
			f.AddrName = next.Name
			f.SetAddress(next)
		}
		return true
	}
	for i := range f.Addresses {
		if f.Addresses[i].Name == name {
			f.Addresses = append(f.Addresses[:i:i], f.Addresses[i+1:]...)
			return true
		}
	}
	return false
}

// AppendAddressJSON appends one address object as GET /addresses prints
// it, with used 0: the form the store keeps an address no farm uses in.
func AppendAddressJSON(dst []byte, a *Address) []byte { return a.appendJSON(dst, 0, true) }

// DecodeAddress decodes one address object (AppendAddressJSON's output)
// and checks its name.
func DecodeAddress(b []byte) (Address, error) {
	// An address kept without an IP prints "ip-addr":"", which the API's
	// decoder refuses (nftlb: "cannot be empty") but which means none.
	b = bytes.Replace(b, []byte(`,"ip-addr":""`), nil, 1)
	as, err := DecodeAddresses(b, func(string) (Address, bool) { return Address{}, false })
	if err != nil {
		return Address{}, err
	}
	if len(as) != 1 {
		return Address{}, &StructureError{Msg: "not one address object"}
	}
	return as[0], nil
}

// SplitAddresses splits a whole-state body's top-level "addresses" (the
// address objects no farm uses, as GET /state prints them) from the rest of
// the body, and decodes them. A body without one is returned as it is.
func SplitAddresses(body []byte) (rest []byte, addrs []Address, err error) {
	d, ok := scanDoc(body)
	defer d.release()
	if !ok || d.toks[0].kind != '{' {
		return body, nil, nil // DecodeFarms reports the error
	}
	av := d.lastMember(0, "addresses")
	if av < 0 {
		return body, nil, nil
	}
	rest = append(rest, '{')
	for k, end := d.children(0); k < end; k = d.toks[k+1].next {
		if d.key(k) == "addresses" {
			continue
		}
		if len(rest) > 1 {
			rest = append(rest, ',')
		}
		rest = append(append(append(rest, d.raw(k)...), ':'), d.raw(k+1)...)
	}
	rest = append(rest, '}')
	if len(rest) == 2 {
		rest = []byte(`{"farms":[]}`)
	}
	addrs, err = DecodeAddresses(append(append([]byte(`{"addresses":`), d.raw(av)...), '}'), func(string) (Address, bool) { return Address{}, false })
	if err != nil {
		return nil, nil, err
	}
	for _, a := range addrs {
		if err := a.Validate(); err != nil {
			return nil, nil, err
		}
	}
	return rest, addrs, nil
}

// AppendUnusedAddressesJSON appends `,"addresses":[...]` (the addresses no
// farm uses, used 0) for a whole-state body; nothing if there are none.
func AppendUnusedAddressesJSON(dst []byte, addrs []*Address) []byte {
	if len(addrs) == 0 {
		return dst
	}
	dst = append(dst, `,"addresses":[`...)
	for i, a := range addrs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = AppendAddressJSON(dst, a)
	}
	return append(dst, ']')
}
