package nft

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// sessionKey formats a persistence map key: its fields joined by "-".
func sessionKey(k model.HashKey, v6 bool, key []byte) string {
	var parts []string
	for _, f := range persistFields {
		if k&f.key == 0 {
			continue
		}
		n := int(f.bytes(v6))
		if len(key) < n {
			break
		}
		b := key[:n]
		switch f.key {
		case model.KeySrcIP, model.KeyDstIP:
			a, _ := netip.AddrFromSlice(b)
			parts = append(parts, a.String())
		case model.KeySrcPort, model.KeyDstPort:
			parts = append(parts, strconv.Itoa(int(binary.BigEndian.Uint16(b))))
		case model.KeySrcMAC:
			parts = append(parts, net.HardwareAddr(b).String())
		}
		key = key[min(len(key), (n+3)/4*4):]
	}
	return strings.Join(parts, "-")
}

// sessionElems lists a farm's persistence map. It returns nil without
// persistence or serving backends (then the farm has no map).
func (p *shard) sessionElems(f *model.Farm) (*farmPlan, *nftables.Set, []nftables.SetElement, error) {
	if p.conn == nil {
		return nil, nil, nil, errors.New("nft data plane is closed")
	}
	s := p.farms[f.Name]
	if s == nil || s.plan == nil || s.plan.persist == "" {
		return nil, nil, nil, nil
	}
	set := s.plan.persistSet(p.table, f, 0)
	els, err := p.conn.GetSetElements(set)
	if err != nil {
		p.redial()
		return nil, nil, nil, fmt.Errorf("list sessions of farm %q: %w", f.Name, err)
	}
	return s.plan, set, els, nil
}

// sessions lists the farm's sessions in the shard's table
// (Plane.Sessions).
func (p *shard) sessions(ctx context.Context, f *model.Farm) ([]dataplane.Session, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if hs := plan.Halves(f); len(hs) > 1 {
		var all []dataplane.Session
		static := map[string]bool{}
		err := dualSessions(f, "", func(h *model.Farm) error {
			ss, err := p.sessions(ctx, h)
			for _, s := range ss {
				if s.Static {
					// One without an address is listed by both halves.
					if static[s.Client] {
						continue
					}
					static[s.Client] = true
				}
				all = append(all, s)
			}
			return err
		})
		return all, err
	}
	// The farm's static sessions first, as nftlb lists them (they are
	// configuration: listed whether or not the farm serves now).
	var out []dataplane.Session
	v6 := f.VirtualAddr.Is6()
	for _, s := range f.Sessions {
		if k, err := model.ParseSessionClient(f.Persistence, s.Client); err == nil {
			if v4, ok := k.Is4(); ok && v4 == v6 {
				continue // the other half's
			}
		}
		out = append(out, dataplane.Session{Client: s.Client, Backend: s.Backend, Static: true})
	}
	pl, _, els, err := p.sessionElems(f)
	if err != nil || pl == nil {
		return out, err
	}
	names := map[uint32]string{}
	for _, b := range f.Backends {
		names[backendID(b)] = b.Name
	}
	for _, e := range els {
		var id uint32
		if len(e.Val) >= 4 {
			id = binary.NativeEndian.Uint32(e.Val)
		}
		out = append(out, dataplane.Session{Client: sessionKey(f.Persistence, pl.v6, e.Key), Backend: names[id], Expires: e.Expires})
	}
	return out, nil
}

// deleteSessions deletes the matching sessions of the farm in one batch
// (Plane.DeleteSessions).
func (p *shard) deleteSessions(ctx context.Context, f *model.Farm, client, backend string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if hs := plan.Halves(f); len(hs) > 1 {
		if backend != "" {
			if _, i := f.Backend(backend); i < 0 {
				return 0, fmt.Errorf("farm %q has no backend %q", f.Name, backend)
			}
		}
		total := 0
		err := dualSessions(f, backend, func(h *model.Farm) error {
			n, err := p.deleteSessions(ctx, h, client, backend)
			total += n
			return err
		})
		return total, err
	}
	pl, set, els, err := p.sessionElems(f)
	if err != nil || pl == nil {
		return 0, err
	}
	var id uint32
	hasID := false
	if backend != "" {
		b, i := f.Backend(backend)
		if i < 0 {
			return 0, fmt.Errorf("farm %q has no backend %q", f.Name, backend)
		}
		id, hasID = backendID(*b), true
	}
	var del []nftables.SetElement
	for _, e := range els {
		match := client != "" && sessionKey(f.Persistence, pl.v6, e.Key) == client
		if hasID && len(e.Val) >= 4 && binary.NativeEndian.Uint32(e.Val) == id {
			match = true
		}
		if match {
			del = append(del, nftables.SetElement{Key: e.Key})
		}
	}
	if len(del) == 0 {
		return 0, nil
	}
	b := p.newBatch()
	for i := 0; i < len(del); i += elemChunk {
		_ = b.c.SetDeleteElements(set, del[i:min(i+elemChunk, len(del))])
	}
	if err := b.flush(); err != nil {
		// A session that expired since the listing makes the batch
		// fail (ENOENT); the caller may retry.
		return 0, fmt.Errorf("delete sessions of farm %q: %w", f.Name, err)
	}
	return len(del), nil
}

// installSessions writes sessions into the farm's persistence map
// (Plane.InstallSessions): new ones added, ones with less time left or
// another backend replaced (deleted and added in the same batch), ones with
// as much time left or more kept.
func (p *shard) installSessions(ctx context.Context, f *model.Farm, ss []dataplane.Session) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if hs := plan.Halves(f); len(hs) > 1 {
		return 0, fmt.Errorf("install sessions of farm %q: a farm of both families is not supported", f.Name)
	}
	pl, set, els, err := p.sessionElems(f)
	if err != nil || pl == nil {
		return 0, err
	}
	have := make(map[string]nftables.SetElement, len(els))
	for _, e := range els {
		have[string(e.Key)] = e
	}
	var add, del []nftables.SetElement
	var first error
	for _, x := range ss {
		k, err := model.ParseSessionClient(f.Persistence, x.Client)
		b, i := f.Backend(x.Backend)
		switch {
		case err != nil:
			first = cmp.Or(first, fmt.Errorf("install session of farm %q: client %q: %w", f.Name, x.Client, err))
			continue
		case i < 0:
			first = cmp.Or(first, fmt.Errorf("install session of farm %q: no backend %q", f.Name, x.Backend))
			continue
		case x.Expires <= 0:
			continue
		}
		key := staticKey(f.Persistence, pl.v6, k)
		val := binary.NativeEndian.AppendUint32(nil, backendID(*b))
		if e, ok := have[string(key)]; ok {
			if e.Expires >= x.Expires {
				continue
			}
			del = append(del, nftables.SetElement{Key: key})
		}
		add = append(add, nftables.SetElement{Key: key, Val: val, Timeout: x.Expires.Round(time.Millisecond)})
	}
	if len(add) == 0 {
		return 0, first
	}
	bt := p.newBatch()
	for i := 0; i < len(del); i += elemChunk {
		_ = bt.c.SetDeleteElements(set, del[i:min(i+elemChunk, len(del))])
	}
	for i := 0; i < len(add); i += elemChunk {
		_ = bt.c.SetAddElements(set, add[i:min(i+elemChunk, len(add))])
	}
	if err := bt.flush(); err != nil {
		// A session that expired since the listing makes the batch
		// fail (ENOENT); the next one (or a dump) brings it again.
		return 0, fmt.Errorf("install sessions of farm %q: %w", f.Name, err)
	}
	return len(add), first
}

// InstallSessions implements dataplane.SessionInstaller on the farm's
// table.
func (s *Plane) InstallSessions(ctx context.Context, f *model.Farm, ss []dataplane.Session) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return 0, errClosed
	}
	return s.shards[s.shardOf(f.Name)].installSessions(ctx, f, ss)
}

// Sessions implements dataplane.SessionStore on the farm's table.
func (s *Plane) Sessions(ctx context.Context, f *model.Farm) ([]dataplane.Session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return nil, errClosed
	}
	return s.shards[s.shardOf(f.Name)].sessions(ctx, f)
}

// DeleteSessions implements dataplane.SessionStore on the farm's table.
func (s *Plane) DeleteSessions(ctx context.Context, f *model.Farm, client, backend string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return 0, errClosed
	}
	return s.shards[s.shardOf(f.Name)].deleteSessions(ctx, f, client, backend)
}

// dualSessions runs fn on each half of a dual farm that has the backend
// (any, when backend is "").
func dualSessions(f *model.Farm, backend string, fn func(h *model.Farm) error) error {
	for _, h := range plan.Halves(f) {
		if backend != "" {
			if _, i := h.Backend(backend); i < 0 {
				continue
			}
		}
		if err := fn(h); err != nil {
			return err
		}
	}
	return nil
}
