package engine

import (
	"context"
	"fmt"
	"slices"

	iradix "github.com/hashicorp/go-immutable-radix/v2"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

// Address objects no farm uses. nftlb's POST /addresses creates an address
// before any farm names it ("used": "0"), and a farm that later names it
// takes its values. An address a farm uses is kept with the farm
// (model.Farm's own address and Addresses); one no farm uses is kept here,
// saved with the change's tables (plan.TableDiff.Addresses) and never in
// the kernel (nftlb programs nothing for it either). As in nftlb, an
// address lives on with the farms that use it: once a farm of a change
// names it, it leaves this set (settleAddresses), and when the last farm
// drops it, it is gone.

// UnusedAddress returns the unused address object of that name.
func (s *State) UnusedAddress(name string) (*model.Address, bool) {
	if s.addrs == nil {
		return nil, false
	}
	return s.addrs.Get([]byte(name))
}

// UnusedAddresses returns the address objects no farm uses, by name.
func (s *State) UnusedAddresses() []*model.Address {
	if s.addrs == nil {
		return nil
	}
	out := make([]*model.Address, 0, s.addrs.Len())
	it := s.addrs.Root().Iterator()
	for _, a, ok := it.Next(); ok; _, a, ok = it.Next() {
		out = append(out, a)
	}
	return out
}

// addrTxn is the unused addresses' part of a Txn.
type addrTxn struct {
	changed map[string]*model.Address // nil value: removed
	order   []string
	replace bool // every address not put is removed (restore)
}

func (tx *Txn) aw() *addrTxn {
	if tx.at == nil {
		tx.at = &addrTxn{changed: map[string]*model.Address{}}
	}
	return tx.at
}

// UnusedAddress returns the unused address object as it stands in this
// transaction.
func (tx *Txn) UnusedAddress(name string) (*model.Address, bool) {
	if tx.at != nil {
		if a, ok := tx.at.changed[name]; ok {
			return a, a != nil
		}
		if tx.at.replace {
			return nil, false
		}
	}
	return tx.base.UnusedAddress(name)
}

// UnusedAddresses returns the transaction's unused addresses, by name.
func (tx *Txn) UnusedAddresses() []*model.Address {
	var out []*model.Address
	if tx.at == nil || !tx.at.replace {
		for _, a := range tx.base.UnusedAddresses() {
			if _, changed := tx.UnusedAddressChanged(a.Name); !changed {
				out = append(out, a)
			}
		}
	}
	if tx.at != nil {
		for _, name := range tx.at.order {
			if a := tx.at.changed[name]; a != nil {
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, func(a, b *model.Address) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// UnusedAddressChanged reports whether the transaction changed the unused
// address of that name, and to what (nil: removed).
func (tx *Txn) UnusedAddressChanged(name string) (*model.Address, bool) {
	if tx.at == nil {
		return nil, false
	}
	a, ok := tx.at.changed[name]
	return a, ok
}

// PutUnusedAddress keeps an address object no farm uses (or changes one).
func (tx *Txn) PutUnusedAddress(a model.Address) error {
	if err := a.Validate(); err != nil {
		return err
	}
	if _, ok := tx.e.store.(store.AddressStore); !ok {
		return &NotSupportedError{Msg: fmt.Sprintf("address %q: no farm uses it, and this daemon's store keeps addresses only with the farms that use them", a.Name)}
	}
	na := a
	na.Ports = slices.Clone(a.Ports)
	tx.setAddr(a.Name, &na)
	return nil
}

// DeleteUnusedAddress removes the unused address object of that name; it
// reports whether there was one.
func (tx *Txn) DeleteUnusedAddress(name string) bool {
	if _, ok := tx.UnusedAddress(name); !ok {
		return false
	}
	tx.setAddr(name, nil)
	return true
}

func (tx *Txn) setAddr(name string, a *model.Address) {
	at := tx.aw()
	if _, seen := at.changed[name]; !seen {
		at.order = append(at.order, name)
	}
	at.changed[name] = a
}

// ReplaceAllAddresses removes every unused address not put afterwards
// (restore; DELETE /farms keeps them, as nftlb does).
func (tx *Txn) ReplaceAllAddresses() {
	for _, a := range tx.UnusedAddresses() {
		tx.setAddr(a.Name, nil)
	}
	tx.aw().replace = true
}

// settleAddresses removes from the unused set every address a farm of this
// transaction names: the farm keeps it now (it took the values when it was
// decoded). It costs O(farms changed), not O(farms).
func (tx *Txn) settleAddresses() {
	if tx.base.addrs.Len() == 0 && tx.at == nil {
		return
	}
	for _, name := range tx.order {
		f := tx.farms[name]
		if f == nil {
			continue
		}
		for _, a := range f.AllAddresses() {
			if _, ok := tx.UnusedAddress(a.Name); ok {
				tx.setAddr(a.Name, nil)
			}
		}
	}
}

// addressDiff lists what the transaction did to unused addresses.
func (tx *Txn) addressDiff() []plan.AddressChange {
	if tx.at == nil {
		return nil
	}
	var out []plan.AddressChange
	for _, name := range tx.at.order {
		old, _ := tx.base.UnusedAddress(name)
		nw := tx.at.changed[name]
		switch {
		case old == nil && nw == nil:
		case old != nil && nw != nil && string(model.AppendAddressJSON(nil, old)) == string(model.AppendAddressJSON(nil, nw)):
		default:
			out = append(out, plan.AddressChange{Old: old, New: nw})
		}
	}
	if tx.at.replace {
		// Those of the base not named in the transaction go too.
		for _, a := range tx.base.UnusedAddresses() {
			if _, named := tx.at.changed[a.Name]; !named {
				out = append(out, plan.AddressChange{Old: a})
			}
		}
	}
	return out
}

// buildAddresses returns the unused addresses of the new published state.
func (tx *Txn) buildAddresses() *iradix.Tree[*model.Address] {
	if tx.at == nil {
		return tx.base.addrs
	}
	t := tx.base.addrs.Txn()
	if tx.at.replace {
		for _, a := range tx.base.UnusedAddresses() {
			t.Delete([]byte(a.Name))
		}
	}
	for _, name := range tx.at.order {
		if a := tx.at.changed[name]; a != nil {
			t.Insert([]byte(name), a)
		} else {
			t.Delete([]byte(name))
		}
	}
	return t.Commit()
}

// loadAddresses puts the saved unused addresses into the load transaction.
// One a saved farm uses (there should be none) is left to the farm.
func (e *Engine) loadAddresses(ctx context.Context, tx *Txn) error {
	as, ok := e.store.(store.AddressStore)
	if !ok {
		return nil
	}
	addrs, err := as.LoadAddresses(ctx)
	if err != nil {
		return err
	}
	for i := range addrs {
		if err := addrs[i].Validate(); err != nil {
			return fmt.Errorf("saved state: %w", err)
		}
		tx.setAddr(addrs[i].Name, &addrs[i])
	}
	return nil
}
