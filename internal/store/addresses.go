package store

import (
	"bytes"
	"context"
	"fmt"
	"io"

	bolt "go.etcd.io/bbolt"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Address objects no farm uses (nftlb's POST /addresses before a farm names
// one): bucket "addresses" maps a name to the address's JSON
// (model.AppendAddressJSON). They change with a change's tables
// (plan.TableDiff.Addresses), as opPutAddr and opDelAddr operations, so the
// journal carries them and UndoLast takes them back as it does tables. An
// address a farm uses is saved with the farm.
var addressesBucket = []byte("addresses")

// AddressStore is a Store that keeps address objects no farm uses.
type AddressStore interface {
	// LoadAddresses returns every saved address object no farm uses.
	LoadAddresses(ctx context.Context) ([]model.Address, error)
}

var (
	_ AddressStore = (*Bolt)(nil)
	_ AddressStore = (*Journal)(nil)
)

func addressName(c plan.AddressChange) string {
	if c.New != nil {
		return c.New.Name
	}
	return c.Old.Name
}

// putAddress writes one address change to the bucket.
func putAddress(b *bolt.Bucket, c plan.AddressChange) error {
	if c.Old != nil && (c.New == nil || c.New.Name != c.Old.Name) {
		if err := b.Delete([]byte(c.Old.Name)); err != nil {
			return err
		}
	}
	if c.New == nil {
		return nil
	}
	return b.Put([]byte(c.New.Name), model.AppendAddressJSON(nil, c.New))
}

// addrOp writes the operation that turns old into nw.
func (w *opWriter) addrOp(old, nw *model.Address) {
	if old != nil && (nw == nil || nw.Name != old.Name) {
		w.str2(opDelAddr, old.Name)
	}
	if nw != nil {
		w.b = append(w.b, opPutAddr)
		w.str(nw.Name)
		w.bytes(model.AppendAddressJSON(nil, nw))
	}
}

func (w *opWriter) str2(op byte, s string) { w.b = append(w.b, op); w.str(s) }

func writeAddresses(tx *bolt.Tx, d plan.TableDiff) error {
	if len(d.Addresses) == 0 {
		return nil
	}
	b, err := tx.CreateBucketIfNotExists(addressesBucket)
	if err != nil {
		return err
	}
	for _, c := range d.Addresses {
		if err := putAddress(b, c); err != nil {
			return err
		}
	}
	return nil
}

func decodeAddresses(kvs func(fn func(k, v []byte) error) error) ([]model.Address, error) {
	var out []model.Address
	err := kvs(func(k, v []byte) error {
		a, err := model.DecodeAddress(v)
		if err != nil {
			return fmt.Errorf("saved address %q: %w", k, err)
		}
		out = append(out, a)
		return nil
	})
	return out, err
}

// LoadAddresses implements AddressStore.
func (s *Bolt) LoadAddresses(ctx context.Context) ([]model.Address, error) {
	var out []model.Address
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(addressesBucket)
		if b == nil {
			return nil
		}
		var err error
		out, err = decodeAddresses(b.ForEach)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("load addresses: %w", err)
	}
	return out, ctx.Err()
}

// LoadAddresses implements AddressStore. A read-only state reads the
// bbolt file's addresses with the journal's records applied in memory.
func (j *Journal) LoadAddresses(ctx context.Context) ([]model.Address, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.ro == nil {
		if err := j.fold(); err != nil {
			return nil, fmt.Errorf("load addresses: %w", err)
		}
		return j.db.LoadAddresses(ctx)
	}
	m := memTables{metas: map[string][]byte{}, slots: map[uint32]map[string][]byte{}, addrs: map[string][]byte{}}
	if j.db != nil {
		if err := j.db.db.View(func(tx *bolt.Tx) error {
			if b := tx.Bucket(addressesBucket); b != nil {
				return b.ForEach(func(k, v []byte) error { m.addrs[string(k)] = bytes.Clone(v); return nil })
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("load addresses: %w", err)
		}
	}
	if j.f != nil {
		buf, err := io.ReadAll(io.NewSectionReader(j.f, 0, 1<<62))
		if err != nil {
			return nil, fmt.Errorf("load addresses: read journal: %w", err)
		}
		for _, r := range validRecords(buf) {
			_, _, tredo, _, err := r.split()
			if err == nil {
				err = m.apply(tredo)
			}
			if err != nil {
				return nil, fmt.Errorf("load addresses: replay journal: %w", err)
			}
		}
	}
	out, err := decodeAddresses(func(fn func(k, v []byte) error) error {
		for k, v := range m.addrs {
			if err := fn([]byte(k), v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load addresses: %w", err)
	}
	return out, ctx.Err()
}
