package engine

import (
	"fmt"
	"slices"
	"strings"

	iradix "github.com/hashicorp/go-immutable-radix/v2"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Named tables in the engine: like farms they are desired state, changed
// only inside Change, published in the snapshot, saved and applied to the
// kernel as part of the same change. Batches of entries report a result per
// entry (ipfw's default: one bad entry does not stop the others) or are
// all-or-nothing (EntryOptions.Atomic).

// tableState is the tables' part of a State.
type tableState struct {
	tables *iradix.Tree[*model.Table]
	// users indexes farms by the tables they attach as policies.
	users *iradix.Tree[[]string]
	// ids are the table IDs in use (bit i: ID i); shared between states
	// and copied when a table is created or destroyed.
	ids *[1024]uint64
	// nextSlot is the next kernel storage slot to hand out.
	nextSlot uint32
}

func emptyTableState() tableState {
	return tableState{tables: iradix.New[*model.Table](), users: iradix.New[[]string](), ids: new([1024]uint64), nextSlot: 1}
}

// Table returns the table with that name.
func (s *State) Table(name string) (*model.Table, bool) { return s.ts.tables.Get([]byte(name)) }

// Tables returns every table, ordered by name.
func (s *State) Tables() []*model.Table {
	out := make([]*model.Table, 0, s.ts.tables.Len())
	it := s.ts.tables.Root().Iterator()
	for _, t, ok := it.Next(); ok; _, t, ok = it.Next() {
		out = append(out, t)
	}
	return out
}

// TableUsers returns the names of the farms that attach the table as a
// policy.
func (s *State) TableUsers(name string) []string {
	u, _ := s.ts.users.Get([]byte(name))
	return u
}

// EntryOptions change how a batch of entries is applied.
type EntryOptions = model.BatchOptions

// EntryResult is the outcome of one entry of a batch.
type EntryResult struct {
	Key string // as the user wrote it
	Err error  // nil: done
}

// tableWork is one table touched by a transaction.
type tableWork struct {
	base *model.Table // as in the transaction's base (nil: none)
	cur  *model.Table // as the transaction leaves it (nil: destroyed)
	// owned: cur is this transaction's private copy, which may be changed
	// in place.
	owned bool
	// changed lists the keys whose entries may differ between base and
	// cur; full says the entries were replaced wholesale (compare all).
	changed map[model.TableKey]struct{}
	full    bool
	swapped bool
}

// tableTxn is the tables' part of a Txn.
type tableTxn struct {
	works   map[string]*tableWork
	order   []string
	replace bool // every table not put is destroyed (restore)
	ids     *[1024]uint64
	idsOwn  bool
	slot    uint32
	now     int64
}

func (tx *Txn) tw() *tableTxn {
	if tx.tt == nil {
		tx.tt = &tableTxn{works: map[string]*tableWork{}, ids: tx.base.ts.ids, slot: tx.base.ts.nextSlot, now: tx.e.now().Unix()}
	}
	return tx.tt
}

// Table returns the table as it stands in this transaction.
func (tx *Txn) Table(name string) (*model.Table, bool) {
	if tx.tt != nil {
		if w, ok := tx.tt.works[name]; ok {
			return w.cur, w.cur != nil
		}
		if tx.tt.replace {
			return nil, false
		}
	}
	return tx.base.Table(name)
}

// Tables returns the transaction's tables as it has them now, in name
// order.
func (tx *Txn) Tables() []*model.Table {
	var out []*model.Table
	seen := map[string]bool{}
	if tx.tt == nil || !tx.tt.replace {
		for _, t := range tx.base.Tables() {
			seen[t.Name] = true
			if cur, ok := tx.Table(t.Name); ok {
				out = append(out, cur)
			}
		}
	}
	if tx.tt != nil {
		for name, w := range tx.tt.works {
			if !seen[name] && w.cur != nil {
				out = append(out, w.cur)
			}
		}
	}
	slices.SortFunc(out, func(a, b *model.Table) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// work returns the table's work record, creating it from the base.
func (tt *tableTxn) work(tx *Txn, name string) *tableWork {
	if w, ok := tt.works[name]; ok {
		return w
	}
	b, _ := tx.base.Table(name)
	w := &tableWork{base: b, cur: b, changed: map[model.TableKey]struct{}{}}
	if tt.replace {
		w.cur = nil
	}
	tt.works[name] = w
	tt.order = append(tt.order, name)
	return w
}

// edit returns the table's private copy for changing in place.
func (w *tableWork) edit() *model.Table {
	if !w.owned {
		c := w.cur.Clone()
		w.cur, w.owned = &c, true
	}
	return w.cur
}

func tableNotFound(name string) error {
	return &NotFoundError{What: fmt.Sprintf("table %q", name)}
}

func lockedError(name string) error {
	return &ConflictError{Msg: fmt.Sprintf("table %q is locked: unlock it first (xlb table %s unlock)", name, name)}
}

// checkTable validates a table and asks the data plane whether it can hold
// it.
func (tx *Txn) checkTable(t *model.Table) error {
	if err := t.Validate(); err != nil {
		return err
	}
	tp, ok := tx.e.dp.(dataplane.TablePlane)
	if !ok {
		return &NotSupportedError{Msg: fmt.Sprintf("table %q: the %s data plane does not keep named tables", t.Name, tx.e.dp.Name())}
	}
	return tp.CheckTable(t)
}

// PutTable creates a table, or changes the definition of an existing one
// (limit, lock, timeout, verdict, log prefix, priority); its entries stay
// as they are (t's entries are ignored). A locked table takes only a
// change that unlocks it.
func (tx *Txn) PutTable(t model.Table) error {
	tt := tx.tw()
	w := tt.work(tx, t.Name)
	nt := t.Clone()
	if w.cur == nil {
		nt.ClearEntries()
		if err := tx.checkTable(&nt); err != nil {
			return err
		}
		if w.base != nil && !w.swapped && w.base.SameKind(&nt) && w.base.Family == nt.Family {
			// A restore of a table that exists keeps its ID and
			// slot: the kernel gets the difference only.
			nt.ID, nt.Slot = w.base.ID, w.base.Slot
			nt = nt.WithEntriesOf(w.base)
			w.full = true
		} else {
			id, err := tt.allocID(t.Name)
			if err != nil {
				return err
			}
			nt.ID, nt.Slot = id, tt.slot
			tt.slot++
			nt.ClearEntries()
		}
		w.cur, w.owned = &nt, true
		return nil
	}
	cur := w.cur
	if cur.Locked && nt.Locked {
		return lockedError(t.Name)
	}
	if !cur.SameKind(&nt) || cur.Family != nt.Family {
		return &model.FieldError{Object: fmt.Sprintf("table %q", t.Name), Field: "type",
			Value: nt.KindString(), Problem: fmt.Sprintf("type, family and valtype cannot change (the table is %s, family %s); destroy and create it", cur.KindString(), cur.Family)}
	}
	nt = nt.WithEntriesOf(cur)
	nt.ID, nt.Slot = cur.ID, cur.Slot
	if err := tx.checkTable(&nt); err != nil {
		return err
	}
	w.cur, w.owned = &nt, true
	return nil
}

// allocID finds a free table ID.
func (tt *tableTxn) allocID(name string) (uint16, error) {
	for i, word := range tt.ids {
		if word == ^uint64(0) {
			continue
		}
		for b := range 64 {
			id := i*64 + b
			if id == 0 || id > model.MaxTables || word&(1<<b) != 0 {
				continue
			}
			tt.setID(uint16(id), true)
			return uint16(id), nil
		}
	}
	return 0, &ConflictError{Msg: fmt.Sprintf("table %q: there are already %d tables, the most xlb holds", name, model.MaxTables)}
}

func (tt *tableTxn) setID(id uint16, used bool) {
	if !tt.idsOwn {
		c := *tt.ids
		tt.ids, tt.idsOwn = &c, true
	}
	if used {
		tt.ids[id/64] |= 1 << (id % 64)
	} else {
		tt.ids[id/64] &^= 1 << (id % 64)
	}
}

// DestroyTable removes a table. It is refused while a farm attaches it or
// while it is locked.
func (tx *Txn) DestroyTable(name string) error {
	t, ok := tx.Table(name)
	if !ok {
		return tableNotFound(name)
	}
	if t.Locked {
		return lockedError(name)
	}
	tt := tx.tw()
	w := tt.work(tx, name)
	if w.cur != nil && (w.base == nil || w.cur.ID != w.base.ID) {
		tt.setID(w.cur.ID, false)
	}
	w.cur, w.owned = nil, false
	return nil
}

// FlushTable removes every entry of a table.
func (tx *Txn) FlushTable(name string) error {
	t, ok := tx.Table(name)
	if !ok {
		return tableNotFound(name)
	}
	if t.Locked {
		return lockedError(name)
	}
	w := tx.tw().work(tx, name)
	if w.cur.Len() == 0 {
		return nil
	}
	w.edit().ClearEntries()
	w.full = true
	return nil
}

// SwapTables exchanges the entries of two tables of the same kind (ipfw's
// table swap): in the kernel one binding flip each, whatever their sizes.
// Each keeps its name, definition and the farms that use it. It is refused
// if either is locked, their kinds differ, or either's entries exceed the
// other's limit.
func (tx *Txn) SwapTables(a, b string) error {
	if a == b {
		return &model.FieldError{Field: "table", Value: a, Problem: "a table cannot be swapped with itself"}
	}
	ta, ok := tx.Table(a)
	if !ok {
		return tableNotFound(a)
	}
	tb, ok := tx.Table(b)
	if !ok {
		return tableNotFound(b)
	}
	switch {
	case ta.Locked:
		return lockedError(a)
	case tb.Locked:
		return lockedError(b)
	case !ta.SameKind(tb):
		return &ConflictError{Msg: fmt.Sprintf("tables %q (%s) and %q (%s) are of different types: only tables of the same type and valtype can be swapped", a, ta.KindString(), b, tb.KindString())}
	case tb.Len() > ta.MaxEntries():
		return &ConflictError{Msg: fmt.Sprintf("table %q holds %d entries, more than the limit of table %q (%d)", b, tb.Len(), a, ta.MaxEntries())}
	case ta.Len() > tb.MaxEntries():
		return &ConflictError{Msg: fmt.Sprintf("table %q holds %d entries, more than the limit of table %q (%d)", a, ta.Len(), b, tb.MaxEntries())}
	case ta.Family != tb.Family && (ta.Family != model.FamilyDual || tb.Family != model.FamilyDual):
		return &ConflictError{Msg: fmt.Sprintf("tables %q (family %s) and %q (family %s) are of different families", a, ta.Family, b, tb.Family)}
	}
	tt := tx.tw()
	wa, wb := tt.work(tx, a), tt.work(tx, b)
	if wa.base == nil || wb.base == nil || wa.cur != wa.base || wb.cur != wb.base || wa.swapped || wb.swapped {
		// A swap flips the kernel bindings of two saved tables; mixed
		// with other changes of the same tables in one transaction it
		// would have to diff entries instead.
		return &ConflictError{Msg: fmt.Sprintf("tables %q and %q: swap them in a change of their own", a, b)}
	}
	na, nb := ta.WithEntriesOf(tb), tb.WithEntriesOf(ta)
	wa.cur, wb.cur = &na, &nb
	wa.swapped, wb.swapped = true, true
	return nil
}

// AddEntries adds a batch of entries to a table. Without opts.Atomic each
// entry gets its result and the good ones are added; with it the first
// error refuses the batch (returned as the error).
func (tx *Txn) AddEntries(name string, ins []model.EntryInput, opts EntryOptions) ([]EntryResult, error) {
	w, err := tx.entryWork(name)
	if err != nil {
		return nil, err
	}
	t := w.edit()
	now := tx.tw().now
	res := make([]EntryResult, len(ins))
	for i, in := range ins {
		res[i].Key = in.Key
		e, err := t.ParseEntry(in, now)
		if err == nil {
			err = addEntry(t, w, e, in.Key, opts.Update)
		}
		if err != nil {
			if opts.Atomic {
				return nil, err
			}
			res[i].Err = err
		}
	}
	return res, nil
}

func addEntry(t *model.Table, w *tableWork, e model.TableEntry, text string, update bool) error {
	old, exists := t.Entry(e.Key)
	switch {
	case exists && !update:
		return &ConflictError{Msg: fmt.Sprintf("table %q entry %q: entry exists", t.Name, text)}
	case exists && model.SameEntry(old, e):
		return nil
	case !exists && t.Len() >= t.MaxEntries():
		return &ConflictError{Msg: fmt.Sprintf("table %q entry %q: the table is full (limit %d entries)", t.Name, text, t.MaxEntries())}
	}
	t.PutEntry(e)
	if !w.full {
		w.changed[e.Key] = struct{}{}
	}
	return nil
}

// DeleteEntries deletes a batch of entries by key, with results as
// AddEntries.
func (tx *Txn) DeleteEntries(name string, keys []string, opts EntryOptions) ([]EntryResult, error) {
	w, err := tx.entryWork(name)
	if err != nil {
		return nil, err
	}
	t := w.edit()
	res := make([]EntryResult, len(keys))
	for i, text := range keys {
		res[i].Key = text
		k, err := t.ParseKey(text)
		if err != nil {
			err = &model.FieldError{Object: fmt.Sprintf("table %q entry %q", name, text), Field: "key", Problem: err.Error()}
		} else if _, ok := t.DeleteEntry(k); !ok {
			err = &NotFoundError{What: fmt.Sprintf("table %q entry %q", name, text)}
		} else if !w.full {
			w.changed[k] = struct{}{}
		}
		if err != nil {
			if opts.Atomic {
				return nil, err
			}
			res[i].Err = err
		}
	}
	return res, nil
}

// ReplaceEntries makes the table hold exactly these entries (all or
// nothing).
func (tx *Txn) ReplaceEntries(name string, ins []model.EntryInput) error {
	w, err := tx.entryWork(name)
	if err != nil {
		return err
	}
	t := w.edit()
	t.ClearEntries()
	w.full = true
	now := tx.tw().now
	for _, in := range ins {
		e, err := t.ParseEntry(in, now)
		if err == nil {
			err = addEntry(t, w, e, in.Key, false)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (tx *Txn) entryWork(name string) (*tableWork, error) {
	t, ok := tx.Table(name)
	if !ok {
		return nil, tableNotFound(name)
	}
	if t.Locked {
		return nil, lockedError(name)
	}
	w := tx.tw().work(tx, name)
	if w.swapped {
		return nil, &ConflictError{Msg: fmt.Sprintf("table %q: swap it in a change of its own", name)}
	}
	return w, nil
}

// expireEntries deletes the entries whose expiry is at or before now.
func (tx *Txn) expireEntries(now int64) int {
	n := 0
	for _, t := range tx.base.Tables() {
		if t.Expiring() == 0 || t.Locked {
			continue
		}
		var keys []model.TableKey
		t.Entries("", func(e model.TableEntry) bool {
			if e.Expires != 0 && e.Expires <= now {
				keys = append(keys, e.Key)
			}
			return true
		})
		if len(keys) == 0 {
			continue
		}
		w := tx.tw().work(tx, t.Name)
		c := w.edit()
		for _, k := range keys {
			c.DeleteEntry(k)
			w.changed[k] = struct{}{}
		}
		n += len(keys)
	}
	return n
}

// replaceAllTables makes every table not put afterwards destroyed
// (restore).
func (tx *Txn) replaceAllTables() {
	tt := tx.tw()
	for _, t := range tx.base.Tables() {
		tt.work(tx, t.Name)
	}
	tt.replace = true
	for _, w := range tt.works {
		w.cur, w.owned = nil, false
	}
	// IDs of tables that are re-put keep theirs (PutTable); the others
	// are freed in build.
}

// validateTables checks the references between farms and tables as this
// transaction leaves them: every policy a farm attaches is a table with a
// verdict or with values the data path applies (mark, limit), and no table
// a farm attaches is destroyed or loses what made it attachable.
func (tx *Txn) validateTables() error {
	for _, name := range tx.order {
		f := tx.farms[name]
		if f == nil {
			continue
		}
		for _, p := range f.Policies {
			t, ok := tx.Table(p.Name)
			if !ok {
				return &model.FieldError{Object: fmt.Sprintf("farm %q", f.Name), Field: "policies", Value: p.Name,
					Problem: "no such policy: create it first (POST /policies, or xlb table create NAME type addr verdict deny)"}
			}
			if !t.Attachable() {
				return &model.FieldError{Object: fmt.Sprintf("farm %q", f.Name), Field: "policies", Value: p.Name,
					Problem: fmt.Sprintf("table %q has no verdict and no mark, limit or dscp values: give it verdict deny or allow (nftlb: type blacklist or whitelist), or create it with valtype mark, limit or dscp", p.Name)}
			}
		}
		if f.SourceTable != "" {
			t, ok := tx.Table(f.SourceTable)
			switch {
			case !ok:
				return &model.FieldError{Object: fmt.Sprintf("farm %q", f.Name), Field: "source-table", Value: f.SourceTable,
					Problem: "no such table: create it first (POST /tables, or xlb table create NAME type addr)"}
			case t.Type != model.TableAddr:
				return &model.FieldError{Object: fmt.Sprintf("farm %q", f.Name), Field: "source-table", Value: f.SourceTable,
					Problem: fmt.Sprintf("table %q is of type %s: a source table must be of type addr (the clients' addresses and prefixes)", t.Name, t.TypeString())}
			}
		}
	}
	if tx.tt == nil {
		return nil
	}
	for _, name := range tx.tt.order {
		w := tx.tt.works[name]
		if w.cur != nil && w.cur.Attachable() {
			continue
		}
		for _, user := range tx.tableUsers(name) {
			if f, ok := tx.Get(user); ok && f.SourceTable == name && !f.UsesPolicy(name) {
				if w.cur == nil {
					return &ConflictError{Msg: fmt.Sprintf("table %q is used by farm %q as its source table: give the farm another first (PUT /farms/%s {\"source-table\": \"\"})", name, user, user)}
				}
				continue // a source table needs no verdict
			}
			if w.cur == nil {
				return &ConflictError{Msg: fmt.Sprintf("table %q is used by farm %q as a policy: detach it first (DELETE /farms/%s/policies/%s)", name, user, user, name)}
			}
			return &ConflictError{Msg: fmt.Sprintf("table %q is used by farm %q as a policy: it must keep a verdict (deny or allow) or its mark, limit or dscp values", name, user)}
		}
	}
	return nil
}

// tableUsers lists the farms that attach the table as this transaction
// leaves them.
func (tx *Txn) tableUsers(table string) []string {
	var out []string
	for _, f := range tx.base.TableUsers(table) {
		if _, changed := tx.farms[f]; !changed && !tx.replace {
			out = append(out, f)
		}
	}
	for _, name := range tx.order {
		if f := tx.farms[name]; f != nil && usesPolicy(f, table) {
			out = append(out, name)
		}
	}
	return out
}

func usesPolicy(f *model.Farm, table string) bool {
	return f.SourceTable == table || f.UsesPolicy(table)
}

// usesTables reports whether a farm uses a table (policies, source
// table): the farms a TableDiff carries to the planes.
func usesTables(f *model.Farm) bool { return len(f.Policies) > 0 || f.SourceTable != "" }

// tableDiff lists what the transaction did to tables, and the farm changes
// of diff that concern policies.
func (tx *Txn) tableDiff(farms plan.Diff) plan.TableDiff {
	var d plan.TableDiff
	for _, c := range farms.Changes {
		if c.Old != nil && usesTables(c.Old) || c.New != nil && usesTables(c.New) {
			d.Farms = append(d.Farms, c)
		}
	}
	if tx.tt == nil {
		return d
	}
	for _, name := range tx.tt.order {
		w := tx.tt.works[name]
		old, nw := w.base, w.cur
		switch {
		case old == nil && nw == nil:
		case old == nil:
			d.Tables = append(d.Tables, plan.TableChange{New: nw})
			d.Slots = append(d.Slots, plan.SlotChange{Slot: nw.Slot, New: nw})
		case nw == nil:
			d.Tables = append(d.Tables, plan.TableChange{Old: old})
			d.Slots = append(d.Slots, plan.SlotChange{Slot: old.Slot, Old: old})
		case old.ID != nw.ID:
			// Destroyed and created again with another kind (restore).
			d.Tables = append(d.Tables, plan.TableChange{Old: old}, plan.TableChange{New: nw})
			d.Slots = append(d.Slots, plan.SlotChange{Slot: old.Slot, Old: old}, plan.SlotChange{Slot: nw.Slot, New: nw})
		case w.swapped:
			d.Tables = append(d.Tables, plan.TableChange{Old: old, New: nw})
		default:
			if !old.SameSpec(nw) {
				d.Tables = append(d.Tables, plan.TableChange{Old: old, New: nw})
			}
			if sc := entryDiff(old, nw, w); len(sc.Put)+len(sc.Del) > 0 {
				d.Slots = append(d.Slots, sc)
			}
		}
	}
	return d
}

// entryDiff compares the entries of a table before and after: by the keys
// the transaction touched, or, when it replaced them wholesale, by walking
// both in key order.
func entryDiff(old, nw *model.Table, w *tableWork) plan.SlotChange {
	sc := plan.SlotChange{Slot: nw.Slot, Old: old, New: nw}
	one := func(o model.TableEntry, okO bool, n model.TableEntry, okN bool) {
		switch {
		case okO && okN:
			if !model.SameEntry(o, n) {
				sc.Put = append(sc.Put, n)
				sc.Replaced = append(sc.Replaced, o)
			}
		case okO:
			sc.Del = append(sc.Del, o)
		case okN:
			sc.Put = append(sc.Put, n)
		}
	}
	if !w.full {
		keys := make([]model.TableKey, 0, len(w.changed))
		for k := range w.changed {
			keys = append(keys, k)
		}
		slices.Sort(keys) // kernel and disk take them in order
		for _, k := range keys {
			o, okO := old.Entry(k)
			n, okN := nw.Entry(k)
			one(o, okO, n, okN)
		}
		return sc
	}
	// Walk both: collect the old entries, then merge with the new.
	var olds []model.TableEntry
	old.Entries("", func(e model.TableEntry) bool { olds = append(olds, e); return true })
	i := 0
	nw.Entries("", func(n model.TableEntry) bool {
		for i < len(olds) && olds[i].Key < n.Key {
			one(olds[i], true, model.TableEntry{}, false)
			i++
		}
		if i < len(olds) && olds[i].Key == n.Key {
			one(olds[i], true, n, true)
			i++
		} else {
			one(model.TableEntry{}, false, n, true)
		}
		return true
	})
	for ; i < len(olds); i++ {
		one(olds[i], true, model.TableEntry{}, false)
	}
	return sc
}

// buildTables returns the tables' part of the new published state.
func (tx *Txn) buildTables(farms plan.Diff) tableState {
	ts := tx.base.ts
	users := ts.users.Txn()
	for _, c := range farms.Changes {
		if c.Old != nil {
			for _, name := range c.Old.TableRefs() {
				removeListener(users, []byte(name), c.Old.Name)
			}
		}
		if c.New != nil {
			for _, name := range c.New.TableRefs() {
				cur, _ := users.Get([]byte(name))
				users.Insert([]byte(name), append(slices.Clone(cur), c.New.Name))
			}
		}
	}
	ts.users = users.Commit()
	if tx.tt == nil {
		return ts
	}
	tt := tx.tt
	tables := ts.tables.Txn()
	for _, name := range tt.order {
		w := tt.works[name]
		if w.base != nil && (w.cur == nil || w.cur.ID != w.base.ID) {
			tt.setID(w.base.ID, false)
		}
		if w.cur == nil {
			tables.Delete([]byte(name))
			continue
		}
		tt.setID(w.cur.ID, true)
		tables.Insert([]byte(name), w.cur)
	}
	ts.tables = tables.Commit()
	ts.ids = tt.ids
	ts.nextSlot = tt.slot
	return ts
}

// loadTables puts saved tables into a transaction as they were (IDs and
// slots included), for New.
func (tx *Txn) loadTables(tables []*model.Table) error {
	tt := tx.tw()
	seen := map[uint16]string{}
	for _, t := range tables {
		if err := t.Validate(); err != nil {
			return err
		}
		if other, dup := seen[t.ID]; dup || t.ID == 0 {
			return fmt.Errorf("tables %q and %q have the same id %d", t.Name, other, t.ID)
		}
		seen[t.ID] = t.Name
		w := tt.work(tx, t.Name)
		w.cur, w.owned = t, true
		tt.setID(t.ID, true)
		tt.slot = max(tt.slot, t.Slot+1)
	}
	return nil
}
