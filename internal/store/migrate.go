package store

import (
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/xlb-lb/xlb/internal/model"
)

// intraConnectKey marks a state file whose farms say "intra-connect" as
// meant. Before it, every farm was saved with "intra-connect": "off" (the
// field was printed so by default) while connections from the LB host were
// balanced anyway; "off" now stops that (docs/nftlb-compat.md). A state
// without the key is migrated once: its farms are rewritten with
// intra-connect on, so a daemon upgraded over its saved state keeps
// balancing what it balanced.
var intraConnectKey = []byte("intra-connect-meant")

// migrate brings the state file up to date (see intraConnectKey). It runs
// after the journal is folded, so no record written before the upgrade is
// applied on top of it.
func (s *Bolt) migrate() error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(metaBucket)
		if meta.Get(intraConnectKey) != nil {
			return nil
		}
		farms := tx.Bucket(farmsBucket)
		put := map[string][]byte{}
		if err := farms.ForEach(func(k, v []byte) error {
			if enc, ok := intraConnectOn(v); ok {
				put[string(k)] = enc
			}
			return nil
		}); err != nil {
			return err
		}
		for k, v := range put {
			if err := farms.Put([]byte(k), v); err != nil {
				return err
			}
		}
		// The undo of the last change holds farms as they were saved.
		if undo := meta.Get(undoKey); len(undo) > 0 {
			var out []byte
			err := decodeUndo(undo, func(name string, old []byte) error {
				if old == nil {
					out = appendFarmEntry(out, name, nil)
					return nil
				}
				fs, err := model.DecodeFarmsUnchecked(old)
				if err != nil || len(fs) != 1 {
					// Kept as it is: UndoLast reports it.
					out = appendRawEntry(out, name, old)
					return nil
				}
				fs[0].IntraConnectOff = false
				out = appendFarmEntry(out, name, &fs[0])
				return nil
			})
			if err != nil {
				return err
			}
			if err := meta.Put(undoKey, out); err != nil {
				return err
			}
		}
		return meta.Put(intraConnectKey, []byte{1})
	})
	if err != nil {
		return fmt.Errorf("migrate state (intra-connect): %w", err)
	}
	return nil
}

// intraConnectOn returns a saved farm's JSON with intra-connect on, ok
// false when it has it on already or cannot be read (the engine reports
// such a farm at start).
func intraConnectOn(v []byte) ([]byte, bool) {
	fs, err := model.DecodeFarmsUnchecked(v)
	if err != nil || len(fs) != 1 || !fs[0].IntraConnectOff {
		return nil, false
	}
	fs[0].IntraConnectOff = false
	return fs[0].AppendJSON(nil), true
}

// migrated reports whether the state file is up to date (migrate), for a
// state opened read-only, which cannot be rewritten: its farms are then
// read as migrate would have written them.
func (s *Bolt) migrated() bool {
	done := false
	_ = s.db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(metaBucket)
		done = meta != nil && meta.Get(intraConnectKey) != nil
		return nil
	})
	return done
}

// appendRawEntry is appendFarmEntry with the farm's JSON as given.
func appendRawEntry(buf []byte, name string, raw []byte) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(name)))
	buf = append(buf, name...)
	buf = binary.AppendUvarint(buf, uint64(len(raw))+1)
	return append(buf, raw...)
}
