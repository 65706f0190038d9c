package engine

import (
	"context"
	"errors"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
)

// A farm that listens nowhere is saved and published but never reaches
// the data plane (nor its Check); given an address, it does; losing it, it
// leaves the kernel again.
func TestFarmWithoutAddress(t *testing.T) {
	e, dp, st, _ := newEngine(t)
	dp.Refuse = func(f *model.Farm) error {
		if !f.Listens() {
			return errors.New("the plane was asked about a farm that listens nowhere")
		}
		return nil
	}
	bare := farm(t, `{"name":"k","backends":[{"name":"b1","ip-addr":"10.1.0.1"}]}`)
	if err := put(e, bare); err != nil {
		t.Fatal(err)
	}
	if e.Snapshot().Len() != 1 || len(dp.Farms()) != 0 || dp.Applies() != 0 || savedNames(t, st) != "k" {
		t.Fatalf("state %d, plane %d (%d applies), saved %q", e.Snapshot().Len(), len(dp.Farms()), dp.Applies(), savedNames(t, st))
	}
	if ss, err := e.Sessions(context.Background(), "k"); err != nil || len(ss) != 0 {
		t.Errorf("sessions of a farm that listens nowhere: %v %v", ss, err)
	}
	withAddr := bare.Clone()
	withAddr.VirtualAddr = webFarm(t, "x", "10.0.0.1", "80").VirtualAddr
	if err := put(e, withAddr); err != nil {
		t.Fatal(err)
	}
	if got := dp.Farms(); len(got) != 1 || got["k"] == nil {
		t.Fatalf("plane holds %v after the farm got an address", got)
	}
	if err := put(e, bare); err != nil {
		t.Fatal(err)
	}
	if got := dp.Farms(); len(got) != 0 {
		t.Fatalf("plane holds %v after the farm lost its address", got)
	}
	if _, err := e.Reconcile(context.Background()); err != nil || len(dp.Farms()) != 0 {
		t.Fatalf("reconcile: %v, plane %v", err, dp.Farms())
	}
}
