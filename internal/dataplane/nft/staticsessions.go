package nft

import (
	"encoding/binary"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"

	"github.com/xlb-lb/xlb/internal/model"
)

// Static sessions (nftlb's "sessions" in a farm body) pin clients to a
// backend by configuration. A farm with persistence and static sessions has
// one more map, rebuilt with its backend map (persist.go):
//
//	map s-<hash>-<gen> { <key> : mark }   client key -> backend id, no timeout
//
// looked up before the dynamic sessions, by the first rule of its chain:
//
//	ct mark set <key> map @s dnat to ct mark map @a
//
// as nftlb 1.0.7 looks up its static-sessions-<farm> map first. A client
// whose static backend does not serve now (down, drained, another priority
// level) misses in @a and is scheduled as any other, so it may get a
// dynamic session meanwhile; its static session wins again once the
// backend serves (nftlb instead accepts the packet with its ct mark set,
// whatever the backend's state).

// staticName is the name of the static sessions map that goes with the
// backend map mapName.
func staticName(mapName string) string { return "s" + mapName[1:] }

// planStatic fills p.static from the farm's static sessions: the ones of
// the plan's family (a dual farm's half takes its own), each keyed as the
// persistence map is and mapping to its backend's id.
func (p *farmPlan) planStatic(f *model.Farm) {
	if p.persist == "" {
		return
	}
	for _, s := range f.Sessions {
		k, err := model.ParseSessionClient(f.Persistence, s.Client)
		if err != nil { // validated by the model
			continue
		}
		if v4, ok := k.Is4(); ok && v4 == p.v6 {
			continue
		}
		b, i := f.Backend(s.Backend)
		if i < 0 {
			continue
		}
		p.static = append(p.static, nftables.SetElement{Key: staticKey(f.Persistence, p.v6, k),
			Val: binaryutil.NativeEndian.PutUint32(backendID(*b))})
	}
}

// staticKey is a client's key as keyLoads loads it: the persistence's
// fields in order, each padded to 4 bytes when there are several (a
// concatenation).
func staticKey(k model.HashKey, v6 bool, sk model.SessionKey) []byte {
	var fields [][]byte
	for _, f := range persistFields {
		if k&f.key == 0 {
			continue
		}
		var b []byte
		switch f.key {
		case model.KeySrcIP:
			b = sk.SrcIP.AsSlice()
		case model.KeyDstIP:
			b = sk.DstIP.AsSlice()
		case model.KeySrcPort:
			b = binary.BigEndian.AppendUint16(nil, sk.SrcPort)
		case model.KeyDstPort:
			b = binary.BigEndian.AppendUint16(nil, sk.DstPort)
		case model.KeySrcMAC:
			b = append([]byte(nil), sk.SrcMAC...)
		}
		fields = append(fields, b)
	}
	if len(fields) == 1 {
		return fields[0]
	}
	var out []byte
	for _, b := range fields {
		out = append(out, b...)
		for len(out)%4 != 0 {
			out = append(out, 0)
		}
	}
	return out
}

// staticSet returns the definition of the farm's static sessions map:
// the persistence map's key and data, without timeout.
func (p *farmPlan) staticSet(t *nftables.Table, f *model.Farm, name string, id uint32) *nftables.Set {
	s := p.persistSet(t, f, id)
	s.Name, s.Dynamic, s.HasTimeout, s.Timeout = name, false, false, 0
	return s
}

// staticRule is the first rule of the chain of a farm with static
// sessions: a listed client goes to its backend if that serves.
func (p *farmPlan) staticRule(f *model.Farm, n *expr.NAT, sset, aset *nftables.Set) []expr.Any {
	loads, _, _ := keyLoads(f.Persistence, p.v6, regKey)
	r := append(nfproto(p.v6), loads...)
	r = append(r,
		&expr.Lookup{SourceRegister: regKey, SetName: sset.Name, SetID: sset.ID, IsDestRegSet: true, DestRegister: reg1},
		&expr.Ct{Key: expr.CtKeyMARK, Register: reg1, SourceRegister: true})
	return append(r, p.resolve(n, aset)...)
}
