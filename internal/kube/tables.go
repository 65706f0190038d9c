package kube

import (
	"errors"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

// The proxy keeps three kinds of named tables of its own: a Service's
// loadBalancerSourceRanges allow list, the allow list that admits nobody
// (a Local policy without local endpoints) and the cluster CIDR's source
// table. Each is put the same way, and each plan handles a refusal (a
// plane without named tables) by leaving out or changing the farms that
// would use it: what differs is only that last step.

// putTable makes tx hold table t with exactly the given entries, and
// leaves tx alone when it does already. A refusal by the engine or the
// data plane is returned as refused; anything else (a kernel or disk
// failure) as err.
func putTable(tx *engine.Txn, t model.Table, entries []model.EntryInput) (refused, err error) {
	if cur, ok := tx.Table(t.Name); ok && cur.SameSpec(&t) && sameEntryKeys(cur, entries) {
		return nil, nil
	}
	err = tx.PutTable(t)
	if err == nil {
		err = tx.ReplaceEntries(t.Name, entries)
	}
	if err == nil {
		return nil, nil
	}
	var ns *engine.NotSupportedError
	if isRejection(err) || errors.As(err, &ns) {
		return err, nil
	}
	return nil, err
}

// sameEntryKeys reports whether table t holds exactly the entries' keys.
func sameEntryKeys(t *model.Table, entries []model.EntryInput) bool {
	if t.Len() != len(entries) {
		return false
	}
	for _, in := range entries {
		k, err := t.ParseKey(in.Key)
		if err != nil {
			return false
		}
		if _, ok := t.Entry(k); !ok {
			return false
		}
	}
	return true
}
