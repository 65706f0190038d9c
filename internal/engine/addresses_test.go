package engine

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

func unusedNames(s *State) string {
	var names []string
	for _, a := range s.UnusedAddresses() {
		names = append(names, a.Name+"="+a.Addr.String())
	}
	return strings.Join(names, ",")
}

// TestUnusedAddressesSaved: address objects no farm uses are kept, saved,
// survive a restart (the store reopened and a new engine started on it),
// leave the set once a farm names them, and UndoLast takes back the last
// change of them, on the bbolt file and on the journal.
func TestUnusedAddressesSaved(t *testing.T) {
	opens := map[string]func(dir string) (undoStore, error){
		"bolt":    func(dir string) (undoStore, error) { return store.OpenBolt(dir) },
		"journal": func(dir string) (undoStore, error) { return store.OpenJournal(dir) },
	}
	for name, open := range opens {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			st, err := open(dir)
			if err != nil {
				t.Fatal(err)
			}
			e, err := New(context.Background(), quiet, fake.New(), st)
			if err != nil {
				t.Fatal(err)
			}
			addr := func(name, ip string) model.Address {
				return model.Address{Name: name, Family: model.FamilyIPv4, Addr: netip.MustParseAddr(ip),
					Ports: []model.PortRange{{First: 80, Last: 80}}, Protocol: model.ProtoTCP}
			}
			if err := change(e, func(tx *Txn) error {
				for _, a := range []model.Address{addr("a1", "10.0.9.1"), addr("a2", "10.0.9.2")} {
					if err := tx.PutUnusedAddress(a); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if got := unusedNames(e.Snapshot()); got != "a1=10.0.9.1,a2=10.0.9.2" {
				t.Fatalf("unused addresses: %s", got)
			}
			// Bad input changes nothing.
			if err := change(e, func(tx *Txn) error {
				return tx.PutUnusedAddress(model.Address{Name: "bad name", Family: model.FamilyIPv4})
			}); err == nil || !strings.Contains(err.Error(), `"name"`) {
				t.Errorf("an address named %q: %v", "bad name", err)
			}
			// One change: a farm names a1 (it keeps it now), a2 goes,
			// a3 comes.
			f := webFarm(t, "f", "10.0.9.1", "80")
			f.AddrName = "a1"
			if err := change(e, func(tx *Txn) error {
				if err := tx.Put(f); err != nil {
					return err
				}
				tx.DeleteUnusedAddress("a2")
				return tx.PutUnusedAddress(addr("a3", "10.0.9.3"))
			}); err != nil {
				t.Fatal(err)
			}
			if got := unusedNames(e.Snapshot()); got != "a3=10.0.9.3" {
				t.Fatalf("after a farm named a1: unused addresses %s", got)
			}
			st.Close()

			restart := func() (*Engine, undoStore) {
				st, err := open(dir)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { st.Close() })
				e, err := New(context.Background(), quiet, fake.New(), st)
				if err != nil {
					t.Fatal(err)
				}
				return e, st
			}
			e, st = restart()
			if got := unusedNames(e.Snapshot()); got != "a3=10.0.9.3" {
				t.Errorf("after a restart: unused addresses %q, want a3", got)
			}
			names, err := st.UndoLast(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(names)
			if want := "address a1,address a2,address a3,f"; strings.Join(names, ",") != want {
				t.Errorf("UndoLast took back %v, want %s", names, want)
			}
			st.Close()
			e, _ = restart()
			if got := unusedNames(e.Snapshot()); got != "a1=10.0.9.1,a2=10.0.9.2" {
				t.Errorf("after UndoLast and a restart: unused addresses %q, want a1 and a2", got)
			}
			if _, ok := e.Snapshot().Farm("f"); ok {
				t.Error("after UndoLast farm f is still saved")
			}
		})
	}
}
