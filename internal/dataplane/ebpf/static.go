package ebpf

import (
	"fmt"

	"github.com/xlb-lb/xlb/internal/model"
)

// Static sessions (nftlb's "sessions" in a farm body) pin a client to a
// backend by configuration. They are entries of xlb_static, keyed as
// xlb_persist is (service key, client address and/or port, by the farm's
// persistence) and holding the backend's address and port; the program
// looks them up before the dynamic sessions when the service's persist
// has hashStatic (bpf/xlb_pick.h lb4_static), and takes the backend only
// if it serves in the current generation: a client whose backend does not
// serve now is scheduled as any other, as on the nft plane. Entries are per
// service key, not per generation: a new generation of the farm writes the
// same keys, and what no generation of the farm holds any more is deleted
// (freeStatic, and strays at Reconcile).

// planStatic fills g.static from the farm's static sessions of the
// generation's family.
func (g *generation) planStatic(f *model.Farm) {
	if f.Persistence == 0 || len(f.Sessions) == 0 {
		return
	}
	for _, s := range f.Sessions {
		k, err := model.ParseSessionClient(f.Persistence, s.Client)
		if err != nil { // validated by the model
			continue
		}
		b, i := f.Backend(s.Backend)
		if i < 0 || k.SrcIP.IsValid() && k.SrcIP.Is4() != f.VirtualAddr.Is4() {
			continue
		}
		val := xlbPersistVal{Addr: addrWords(b.Addr), Port: ne16(b.Port)}
		for _, sk := range g.keys {
			pk := xlbPersistKey{Svc: sk}
			if f.Persistence&model.KeySrcIP != 0 {
				pk.Src = addrWords(k.SrcIP)
			}
			if f.Persistence&model.KeySrcPort != 0 {
				pk.Sport = ne16(k.SrcPort)
			}
			g.staticKeys = append(g.staticKeys, pk)
			g.staticVals = append(g.staticVals, val)
		}
	}
	if len(g.staticKeys) > 0 {
		g.val.Persist |= hashStatic
	}
}

func (g *generation) hasStatic(k xlbPersistKey) bool {
	for _, x := range g.staticKeys {
		if x == k {
			return true
		}
	}
	return false
}

// writeStatic writes g's static sessions.
func (p *Plane) writeStatic(g *generation) error {
	if len(g.staticKeys) == 0 {
		return nil
	}
	if _, err := p.objs.XlbStatic.BatchUpdate(g.staticKeys, g.staticVals, nil); err != nil {
		return fmt.Errorf("farm %q: write static sessions: %w", g.farm, err)
	}
	return nil
}

// freeStatic deletes g's static sessions that no current generation holds
// (another farm's: a farm renamed keeps its service keys).
func (p *Plane) freeStatic(g *generation) {
	if len(g.staticKeys) == 0 {
		return
	}
	for _, k := range g.staticKeys {
		held := false
		for _, cur := range p.farms {
			if cur != g && cur.hasStatic(k) {
				held = true
				break
			}
		}
		if !held {
			_ = p.objs.XlbStatic.Delete(k)
		}
	}
}

// dropStaleStatic deletes the static sessions no farm holds (Reconcile:
// an earlier run's).
func (p *Plane) dropStaleStatic() error {
	live := map[xlbPersistKey]bool{}
	for _, g := range p.farms {
		for _, k := range g.staticKeys {
			live[k] = true
		}
	}
	var k xlbPersistKey
	var v xlbPersistVal
	var stale []xlbPersistKey
	it := p.objs.XlbStatic.Iterate()
	for it.Next(&k, &v) {
		if !live[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read static sessions: %w", err)
	}
	for _, k := range stale {
		_ = p.objs.XlbStatic.Delete(k)
	}
	return nil
}
