package dataplane

import (
	"context"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Named tables reach a data plane as two kinds of kernel object: storage
// slots that hold entries (an nftables set, a BPF map), and tables that
// are bound to a slot (the name and ID farms refer to). A swap of two
// tables exchanges their slots, so the kernel changes one binding per
// table, whatever the tables' sizes.

// TablePlane is implemented by data planes that keep named tables in the
// kernel and enforce farms' policies.
type TablePlane interface {
	// CheckTable refuses a table this plane cannot hold, with a
	// *model.FieldError. It must not touch the kernel.
	CheckTable(t *model.Table) error
	// ApplyTables applies d as one kernel transaction, before the farm
	// changes of the same engine change are applied (so a farm never
	// serves a moment without the policies it is given).
	ApplyTables(ctx context.Context, d plan.TableDiff) error
	// ReconcileTables makes the kernel hold exactly these tables and
	// these farms' policies, repairing what was changed by hand, without
	// a moment where a table is empty. It runs before Reconcile.
	ReconcileTables(ctx context.Context, tables []*model.Table, farms []*model.Farm) error
}

// TableCounters are the per-entry counters a plane keeps, by key.
type TableCounters map[model.TableKey]EntryCounters

// EntryCounters count the packets and bytes that matched one entry.
type EntryCounters struct {
	Packets, Bytes uint64
}

// TableCounterReader is implemented by planes that count matches per entry.
type TableCounterReader interface {
	// TableCounters reads the counters of the table's entries.
	TableCounters(ctx context.Context, t *model.Table) (TableCounters, error)
}

// TableDescriber is implemented by planes that can say how they hold a
// table in the kernel (what ipfw's "table T detail" calls the algorithm).
type TableDescriber interface {
	// TableAlgorithm describes the kernel objects that hold the table,
	// e.g. "nftables interval set (ipv4_addr) + interval set (ipv6_addr)".
	TableAlgorithm(t *model.Table) string
}
