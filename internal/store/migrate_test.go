package store

import (
	"context"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
)

// A state saved before "intra-connect" meant anything (every farm saved
// with "off", its connections from the LB host balanced all the same)
// loads with intra-connect on, from the state file, the journal's records
// and the undo; a farm saved "off" after the migration stays off.
func TestMigrateIntraConnect(t *testing.T) {
	eachStore(t, func(t *testing.T, open func(string) (undoStore, error)) {
		ctx := context.Background()
		dir := t.TempDir()
		s, err := open(dir)
		if err != nil {
			t.Fatal(err)
		}
		a, b := testFarm(t, 1), testFarm(t, 2)
		a.IntraConnectOff, b.IntraConnectOff = true, true
		if err := s.Commit(ctx, plan.Diff{Changes: []plan.FarmChange{{New: a}}}); err != nil {
			t.Fatal(err)
		}
		b2 := b.Clone()
		b2.PersistTTL = 99
		if err := s.Commit(ctx, plan.Diff{Changes: []plan.FarmChange{{New: b}}}); err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(ctx, plan.Diff{Changes: []plan.FarmChange{{Old: b, New: &b2}}}); err != nil {
			t.Fatal(err)
		}
		s.Close()
		// As an older daemon leaves it: no migration key (the journal,
		// if any, still holds its records).
		db, err := bolt.Open(dir+"/"+FileName, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket(metaBucket).Delete(intraConnectKey) }); err != nil {
			t.Fatal(err)
		}
		db.Close()

		s, err = open(dir)
		if err != nil {
			t.Fatal(err)
		}
		farms, err := s.Load(ctx)
		if err != nil || len(farms) != 2 {
			t.Fatalf("load: %v, %d farms", err, len(farms))
		}
		for _, f := range farms {
			if f.IntraConnectOff {
				t.Errorf("farm %s saved before the migration: intra-connect off, want on", f.Name)
			}
		}
		if names, err := s.UndoLast(ctx); err != nil || len(names) != 1 {
			t.Fatalf("undo: %v %v", names, err)
		}
		farms, _ = s.Load(ctx)
		for _, f := range farms {
			if f.IntraConnectOff || f.Name == "f2" && f.PersistTTL == 99 {
				t.Errorf("after undo: farm %s off %v ttl %d, want on and the old ttl", f.Name, f.IntraConnectOff, f.PersistTTL)
			}
		}
		c := testFarm(t, 3)
		c.IntraConnectOff = true
		if err := s.Commit(ctx, plan.Diff{Changes: []plan.FarmChange{{New: c}}}); err != nil {
			t.Fatal(err)
		}
		s.Close()
		s, err = open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		farms, _ = s.Load(ctx)
		got := map[string]bool{}
		for _, f := range farms {
			got[f.Name] = f.IntraConnectOff
		}
		if want := map[string]bool{"f1": false, "f2": false, "f3": true}; len(got) != 3 || got["f1"] || got["f2"] || !got["f3"] {
			t.Errorf("after reopening: off by farm %v, want %v", got, want)
		}
	})
}
