package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func farm(t testing.TB, body string) model.Farm {
	t.Helper()
	fs, err := model.DecodeFarms([]byte(body), func(string) (*model.Farm, bool) { return nil, false })
	if err != nil {
		t.Fatal(err)
	}
	return fs[0]
}

func webFarm(t testing.TB, name, vip, ports string) model.Farm {
	return farm(t, fmt.Sprintf(`{"name":%q,"virtual-addr":%q,"virtual-ports":%q,"backends":[{"name":"b1","ip-addr":"10.1.0.1"}]}`, name, vip, ports))
}

// failingStore wraps a store and fails Commit on demand.
type failingStore struct {
	store.Store
	fail bool
}

func (s *failingStore) Commit(ctx context.Context, d plan.Diff) error {
	if s.fail {
		return errors.New("injected disk failure")
	}
	return s.Store.Commit(ctx, d)
}

// Revert and UndoLast pass through to the bbolt store (store.Undoer).
func (s *failingStore) Revert(ctx context.Context, d plan.Diff) error {
	return s.Store.(store.Undoer).Revert(ctx, d)
}

func (s *failingStore) UndoLast(ctx context.Context) ([]string, error) {
	return s.Store.(store.Undoer).UndoLast(ctx)
}

func newEngine(t *testing.T) (*Engine, *fake.Plane, *failingStore, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.OpenBolt(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	fs := &failingStore{Store: st}
	dp := fake.New()
	e, err := New(context.Background(), quiet, dp, fs)
	if err != nil {
		t.Fatal(err)
	}
	return e, dp, fs, dir
}

func put(e *Engine, fs ...model.Farm) error {
	_, err := e.Change(context.Background(), func(tx *Txn) error {
		for _, f := range fs {
			if err := tx.Put(f); err != nil {
				return err
			}
		}
		return nil
	})
	return err
}

func savedNames(t *testing.T, st store.Store) string {
	t.Helper()
	farms, err := st.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range farms {
		names = append(names, f.Name)
	}
	return strings.Join(names, ",")
}

func TestChangeAppliesPersistsPublishes(t *testing.T) {
	e, dp, st, _ := newEngine(t)
	if err := put(e, webFarm(t, "a", "10.0.0.1", "80"), webFarm(t, "b", "10.0.0.1", "443")); err != nil {
		t.Fatal(err)
	}
	if e.Snapshot().Len() != 2 || len(dp.Farms()) != 2 || savedNames(t, st) != "a,b" {
		t.Fatalf("state %d, plane %d, saved %q", e.Snapshot().Len(), len(dp.Farms()), savedNames(t, st))
	}
	if dp.Applies() != 1 {
		t.Errorf("two farms in one change took %d kernel transactions, want 1", dp.Applies())
	}
}

// A kernel failure leaves the published state, the kernel and the disk as before.
func TestKernelFailureChangesNothing(t *testing.T) {
	e, dp, st, _ := newEngine(t)
	if err := put(e, webFarm(t, "a", "10.0.0.1", "80")); err != nil {
		t.Fatal(err)
	}
	before := e.Snapshot()
	dp.FailApply = func(plan.Diff) error { return fake.ErrInjected }
	err := put(e, webFarm(t, "b", "10.0.0.2", "80"))
	if !errors.Is(err, fake.ErrInjected) || !strings.Contains(err.Error(), "apply to fake data plane") {
		t.Fatalf("error %v, want the injected kernel failure with context", err)
	}
	if e.Snapshot() != before {
		t.Error("published state changed after a failed change")
	}
	if savedNames(t, st) != "a" {
		t.Errorf("saved state %q, want only a", savedNames(t, st))
	}
	if _, ok := dp.Farms()["b"]; ok {
		t.Error("kernel holds farm b after a failed change")
	}
}

// A disk failure rolls the kernel back: the caller is told nothing changed,
// so nothing may have.
func TestStoreFailureRollsBackKernel(t *testing.T) {
	e, dp, st, _ := newEngine(t)
	a := webFarm(t, "a", "10.0.0.1", "80")
	if err := put(e, a); err != nil {
		t.Fatal(err)
	}
	st.fail = true
	changed := a.Clone()
	changed.Scheduler = model.SchedWeight
	err := put(e, changed, webFarm(t, "b", "10.0.0.2", "80"))
	if err == nil || !strings.Contains(err.Error(), "injected disk failure") {
		t.Fatalf("error %v, want the disk failure", err)
	}
	k := dp.Farms()
	if _, ok := k["b"]; ok || k["a"].Scheduler != model.SchedRR {
		t.Errorf("kernel not rolled back: %v", k)
	}
	st.fail = false
	if savedNames(t, st) != "a" {
		t.Errorf("saved %q", savedNames(t, st))
	}
}

func TestConflicts(t *testing.T) {
	e, _, _, _ := newEngine(t)
	if err := put(e, webFarm(t, "a", "10.0.0.1", "80,1000-2000")); err != nil {
		t.Fatal(err)
	}
	var ce *ConflictError
	err := put(e, webFarm(t, "b", "10.0.0.1", "1500"))
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), `farm "a"`) || !strings.Contains(err.Error(), "10.0.0.1") {
		t.Errorf("overlapping range: %v", err)
	}
	// Same VIP and port, other protocol: fine.
	udp := webFarm(t, "u", "10.0.0.1", "80")
	udp.Protocol = model.ProtoUDP
	if err := put(e, udp); err != nil {
		t.Errorf("udp on the tcp farm's port: %v", err)
	}
	// Two new farms in one change that clash with each other.
	err = put(e, webFarm(t, "c", "10.0.0.9", "80"), webFarm(t, "d", "10.0.0.9", "80"))
	if !errors.As(err, &ce) {
		t.Errorf("clash inside one change: %v", err)
	}
	// Moving a farm away frees its port in the same change.
	moved := webFarm(t, "a", "10.0.0.2", "80")
	if err := put(e, moved, webFarm(t, "b", "10.0.0.1", "80")); err != nil {
		t.Errorf("move and take over in one change: %v", err)
	}
	// An off farm does not hold its VIP.
	off := webFarm(t, "z", "10.0.0.1", "80")
	off.State = model.StateOff
	if err := put(e, off); err != nil {
		t.Errorf("off farm: %v", err)
	}
}

// A farm's further addresses (nftlb's "addresses") hold their address,
// protocol and ports as its own does.
func TestConflictsFurtherAddresses(t *testing.T) {
	e, _, _, _ := newEngine(t)
	a := webFarm(t, "a", "10.0.0.1", "80")
	a.Addresses = []model.Address{{Name: "a2", Family: model.FamilyIPv4, Addr: netip.MustParseAddr("10.0.0.2"),
		Ports: []model.PortRange{{First: 443, Last: 443}}, Protocol: model.ProtoTCP}}
	if err := put(e, a); err != nil {
		t.Fatal(err)
	}
	var ce *ConflictError
	if err := put(e, webFarm(t, "b", "10.0.0.2", "443")); !errors.As(err, &ce) || !strings.Contains(err.Error(), `farm "a"`) || !strings.Contains(err.Error(), "10.0.0.2 tcp port 443") {
		t.Errorf("a farm on another farm's further address: %v", err)
	}
	// The same address, another port: fine.
	if err := put(e, webFarm(t, "c", "10.0.0.2", "80")); err != nil {
		t.Errorf("another port of the further address: %v", err)
	}
	// A further address on a port another farm serves.
	d := webFarm(t, "d", "10.0.0.5", "80")
	d.Addresses = []model.Address{{Name: "d2", Family: model.FamilyIPv4, Addr: netip.MustParseAddr("10.0.0.2"),
		Ports: []model.PortRange{{First: 80, Last: 80}}, Protocol: model.ProtoTCP}}
	if err := put(e, d); !errors.As(err, &ce) || !strings.Contains(err.Error(), `farm "c"`) {
		t.Errorf("a further address on another farm's VIP and port: %v", err)
	}
}

func TestDeleteAndNotFound(t *testing.T) {
	e, dp, st, _ := newEngine(t)
	if err := put(e, webFarm(t, "a", "10.0.0.1", "80")); err != nil {
		t.Fatal(err)
	}
	_, err := e.Change(context.Background(), func(tx *Txn) error { return tx.Delete("nope") })
	if !IsNotFound(err) {
		t.Errorf("delete of a missing farm: %v", err)
	}
	if _, err := e.Change(context.Background(), func(tx *Txn) error { return tx.Delete("a") }); err != nil {
		t.Fatal(err)
	}
	if e.Snapshot().Len() != 0 || len(dp.Farms()) != 0 || savedNames(t, st) != "" {
		t.Error("farm a still somewhere after delete")
	}
	// The freed VIP can be taken again.
	if err := put(e, webFarm(t, "b", "10.0.0.1", "80")); err != nil {
		t.Error(err)
	}
}

// The diff handed to the kernel holds only what changed.
func TestDiffIsOnlyWhatChanged(t *testing.T) {
	e, dp, _, _ := newEngine(t)
	var all []model.Farm
	for i := range 100 {
		all = append(all, webFarm(t, fmt.Sprintf("f%03d", i), fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), "80"))
	}
	if err := put(e, all...); err != nil {
		t.Fatal(err)
	}
	var seen []plan.Diff
	dp.FailApply = func(d plan.Diff) error { seen = append(seen, d); return nil }
	// Re-putting unchanged farms is not a change at all.
	if err := put(e, all[:10]...); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 0 {
		t.Errorf("unchanged farms reached the kernel: %d diffs", len(seen))
	}
	changed := all[5].Clone()
	changed.Backends[0].Weight = 7
	if err := put(e, changed); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 || len(seen[0].Changes) != 1 || seen[0].Changes[0].Old.Name != "f005" {
		t.Errorf("diff %+v, want the one changed farm", seen)
	}
}

func TestReplaceAll(t *testing.T) {
	e, dp, st, _ := newEngine(t)
	if err := put(e, webFarm(t, "a", "10.0.0.1", "80"), webFarm(t, "b", "10.0.0.2", "80")); err != nil {
		t.Fatal(err)
	}
	_, err := e.Change(context.Background(), func(tx *Txn) error {
		tx.ReplaceAll()
		return tx.Put(webFarm(t, "c", "10.0.0.1", "80")) // takes a's VIP in the same change
	})
	if err != nil {
		t.Fatal(err)
	}
	if savedNames(t, st) != "c" || len(dp.Farms()) != 1 || e.Snapshot().Len() != 1 {
		t.Errorf("after restore: saved %q, kernel %d", savedNames(t, st), len(dp.Farms()))
	}
}

// A data plane's refusal reaches the caller unchanged.
func TestDataplaneRefusal(t *testing.T) {
	e, dp, _, _ := newEngine(t)
	dp.Refuse = func(f *model.Farm) error {
		if f.Mode == model.ModeDSR {
			return dataplane.Unsupported("fake", f, "mode", "dsr")
		}
		return nil
	}
	f := webFarm(t, "a", "10.0.0.1", "80")
	f.Mode = model.ModeDSR
	err := put(e, f)
	var fe *model.FieldError
	if !errors.As(err, &fe) || fe.Field != "mode" || !strings.Contains(err.Error(), "not implemented by the fake data plane") {
		t.Errorf("refusal: %v", err)
	}
}

// Restart: the engine loads the saved state and hands all of it to the data
// plane's Reconcile.
func TestRestartReconciles(t *testing.T) {
	dir := t.TempDir()
	st, err := store.OpenBolt(dir)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(context.Background(), quiet, fake.New(), st)
	if err != nil {
		t.Fatal(err)
	}
	if err := put(e, webFarm(t, "a", "10.0.0.1", "80"), webFarm(t, "b", "10.0.0.2", "80")); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st2, err := store.OpenBolt(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	dp2 := fake.New()
	e2, err := New(context.Background(), quiet, dp2, st2)
	if err != nil {
		t.Fatal(err)
	}
	if e2.Snapshot().Len() != 2 || len(dp2.Farms()) != 2 {
		t.Errorf("after restart: state %d farms, kernel %d", e2.Snapshot().Len(), len(dp2.Farms()))
	}
}

// A crash can leave the last change on disk with its kernel outcome unseen
// (the disk and the kernel take a change at the same time). If the kernel
// refuses the saved state at start, that change is taken back and the rest
// starts; a kernel that refuses older state still stops the start.
func TestStartTakesBackALastChangeTheKernelRefuses(t *testing.T) {
	dir := t.TempDir()
	st, err := store.OpenBolt(dir)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(context.Background(), quiet, fake.New(), st)
	if err != nil {
		t.Fatal(err)
	}
	if err := put(e, webFarm(t, "a", "10.0.0.1", "80")); err != nil {
		t.Fatal(err)
	}
	a2 := webFarm(t, "a", "10.0.0.1", "80,81")
	if err := put(e, a2, webFarm(t, "bad", "10.0.0.2", "80")); err != nil {
		t.Fatal(err)
	}
	st.Close()

	refuseBad := func(farms []*model.Farm) error {
		for _, f := range farms {
			if f.Name == "bad" {
				return errors.New("kernel says no to farm bad")
			}
		}
		return nil
	}
	st2, err := store.OpenBolt(dir)
	if err != nil {
		t.Fatal(err)
	}
	dp := fake.New()
	dp.FailReconcile = refuseBad
	e2, err := New(context.Background(), quiet, dp, st2)
	if err != nil {
		t.Fatalf("start with a refused last change: %v", err)
	}
	if got := savedNames(t, st2); got != "a" {
		t.Errorf("saved after start %q, want a", got)
	}
	if f, ok := e2.Snapshot().Farm("a"); !ok || f.VirtualPorts[len(f.VirtualPorts)-1].Last != 80 {
		t.Errorf("farm a after start: %+v, want its version before the last change (port 80 only)", f)
	}
	if len(dp.Farms()) != 1 {
		t.Errorf("kernel holds %d farms, want 1", len(dp.Farms()))
	}
	st2.Close()

	// The undo is spent: a kernel that now refuses farm a stops the start.
	st3, err := store.OpenBolt(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st3.Close()
	dp3 := fake.New()
	dp3.FailReconcile = func([]*model.Farm) error { return errors.New("kernel refuses everything") }
	if _, err := New(context.Background(), quiet, dp3, st3); err == nil || !strings.Contains(err.Error(), "kernel refuses everything") {
		t.Errorf("start against a refusing kernel: %v, want its error", err)
	}
	if got := savedNames(t, st3); got != "a" {
		t.Errorf("saved state changed by a failed start: %q", got)
	}
}

// A kernel failure after the disk took the change reverts the disk without
// leaving an undo behind that a later start could replay.
func TestKernelFailureLeavesNoUndo(t *testing.T) {
	e, dp, st, dir := newEngine(t)
	if err := put(e, webFarm(t, "a", "10.0.0.1", "80")); err != nil {
		t.Fatal(err)
	}
	dp.FailApply = func(plan.Diff) error { return fake.ErrInjected }
	if err := put(e, webFarm(t, "b", "10.0.0.2", "80")); !errors.Is(err, fake.ErrInjected) {
		t.Fatalf("error %v", err)
	}
	st.Store.Close()
	st2, err := store.OpenBolt(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	names, err := st2.UndoLast(context.Background())
	if err != nil || len(names) != 0 {
		t.Errorf("undo left after a reverted change: %v %v", names, err)
	}
	if got := savedNames(t, st2); got != "a" {
		t.Errorf("saved %q", got)
	}
}

func TestSnapshotsAreImmutable(t *testing.T) {
	e, _, _, _ := newEngine(t)
	if err := put(e, webFarm(t, "a", "10.0.0.1", "80")); err != nil {
		t.Fatal(err)
	}
	old := e.Snapshot()
	if err := put(e, webFarm(t, "b", "10.0.0.2", "80")); err != nil {
		t.Fatal(err)
	}
	if old.Len() != 1 || e.Snapshot().Len() != 2 || e.Snapshot().Version() != old.Version()+1 {
		t.Error("an old snapshot saw a later change")
	}
}

func BenchmarkChangeOneFarm(b *testing.B) {
	for _, existing := range []int{0, 1000, 10000} {
		b.Run(fmt.Sprintf("existing=%d", existing), func(b *testing.B) {
			st, err := store.OpenBolt(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			e, err := New(context.Background(), quiet, fake.New(), st)
			if err != nil {
				b.Fatal(err)
			}
			var all []model.Farm
			for i := range existing {
				all = append(all, webFarm(b, fmt.Sprintf("f%05d", i), fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255), "80"))
			}
			if err := put(e, all...); err != nil {
				b.Fatal(err)
			}
			f := webFarm(b, "bench", "172.16.0.1", "80")
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				f.Backends[0].Weight = uint32(i%100 + 1)
				if err := put(e, f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A family dual farm holds both of its VIPs: a farm on either clashes,
// and freeing one frees it.
func TestConflictsDual(t *testing.T) {
	e, _, _, _ := newEngine(t)
	dual := farm(t, `{"name":"dual","family":"dual","virtual-addr":"10.0.0.1,fd00::1","virtual-ports":"80"}`)
	if err := put(e, dual); err != nil {
		t.Fatal(err)
	}
	v6 := farm(t, `{"name":"v6","family":"ipv6","virtual-addr":"fd00::1","virtual-ports":"80"}`)
	var ce *ConflictError
	if err := put(e, v6); !errors.As(err, &ce) || !strings.Contains(err.Error(), "fd00::1") || !strings.Contains(err.Error(), `farm "dual"`) {
		t.Errorf("farm on the dual farm's IPv6 VIP: %v", err)
	}
	if err := put(e, webFarm(t, "v4", "10.0.0.1", "80")); !errors.As(err, &ce) {
		t.Errorf("farm on the dual farm's IPv4 VIP: %v", err)
	}
	single := dual.Clone()
	single.VirtualAddr2 = netip.Addr{}
	if err := put(e, single); err != nil {
		t.Fatal(err)
	}
	if err := put(e, v6); err != nil {
		t.Errorf("the IPv6 VIP was freed: %v", err)
	}
}
