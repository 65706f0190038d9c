package engine

import (
	"context"
	"fmt"
	"slices"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

// Start-up never refuses the daemon's own saved state. A saved farm that
// no longer validates (a rule became stricter since it was saved) is
// loaded as it is, into the state and the kernel, and reported: the user
// fixes it through the API, and until then it serves as before. A saved
// farm that cannot be loaded at all (it does not decode, this data plane
// cannot do it, it clashes with another saved farm, or the kernel refuses
// it) is set aside: its saved JSON goes to a file under
// <state-dir>/set-aside/ and it leaves the saved state, so the state the
// daemon serves and the one on disk stay the same. Both kinds are listed
// by Problems (GET /state/problems, `xlb problems`).

// Problem is a saved farm that start-up loaded with a problem, or could
// not load.
type Problem struct {
	Farm    string
	Loaded  bool   // in the state and the kernel as saved; false: set aside
	Problem string // what is wrong
	File    string // set aside: the file holding its saved JSON
}

// Problems returns the problems found in the saved state at start-up that
// are not fixed yet: a farm's problem goes away once a change puts or
// deletes a farm of that name.
func (e *Engine) Problems() []Problem {
	if p := e.problems.Load(); p != nil {
		return slices.Clone(*p)
	}
	return nil
}

// clearProblems forgets the problems of the farms a committed change
// touched.
func (e *Engine) clearProblems(names []string) {
	p := e.problems.Load()
	if p == nil || len(*p) == 0 {
		return
	}
	left := slices.DeleteFunc(slices.Clone(*p), func(pr Problem) bool { return slices.Contains(names, pr.Farm) })
	if len(left) != len(*p) {
		e.problems.Store(&left)
	}
}

// loaded is what loadSaved found.
type loaded struct {
	state *State
	// invalid: loaded farms that do not validate any more; aside: saved
	// farms to set aside, with why.
	invalid map[string]string
	aside   []store.SavedFarm
	why     map[string]string
}

// loadSaved reads the saved state farm by farm (if the store can) without
// refusing any of it; see the comment at the top of this file.
func (e *Engine) loadSaved(ctx context.Context) (*loaded, error) {
	sl, ok := e.store.(store.SavedLoader)
	if !ok {
		s, err := e.load(ctx)
		if err != nil {
			return nil, err
		}
		return &loaded{state: s}, nil
	}
	saved, err := sl.LoadSaved(ctx)
	if err != nil {
		return nil, err
	}
	// Tables first: farms' policies name them.
	base := emptyState()
	{
		tx := e.begin(base)
		if err := e.loadTables(ctx, tx); err != nil {
			return nil, err
		}
		if err := e.loadAddresses(ctx, tx); err != nil {
			return nil, err
		}
		base = tx.build(tx.diff())
	}
	l := &loaded{invalid: map[string]string{}, why: map[string]string{}}
	var farms []model.Farm
	bySaved := map[string]store.SavedFarm{}
	for _, sf := range saved {
		bySaved[sf.Name] = sf
		if sf.Err != nil {
			l.setAside(sf, "cannot be read: "+sf.Err.Error())
			continue
		}
		if err := e.dp.Check(&sf.Farm); err != nil {
			l.setAside(sf, err.Error())
			continue
		}
		if err := sf.Farm.Validate(); err != nil {
			l.invalid[sf.Name] = err.Error()
		}
		farms = append(farms, sf.Farm)
	}
	tx := e.begin(base)
	for i := range farms {
		tx.load(farms[i])
	}
	if err := tx.validateLoad(); err == nil {
		l.state = tx.build(tx.diff())
		return l, nil
	}
	// Two saved farms on one listener: keep the first by name, set the
	// others aside (the kernel cannot hold both). Each farm is checked
	// against those kept so far, through the state's listener index:
	// O(n log n), not a validation of all of them per farm.
	s := base
	for i := range farms {
		tx := e.begin(s)
		tx.load(farms[i])
		if err := tx.validateLoad(); err != nil {
			delete(l.invalid, farms[i].Name)
			l.setAside(bySaved[farms[i].Name], err.Error())
			continue
		}
		s = tx.build(tx.diff())
	}
	l.state = s
	return l, nil
}

func (l *loaded) setAside(sf store.SavedFarm, why string) {
	l.aside = append(l.aside, sf)
	l.why[sf.Name] = why
}

// validateLoad checks saved farms against each other and the tables:
// what a saved farm cannot be served with (a clash, a missing policy).
func (tx *Txn) validateLoad() error {
	if err := tx.validate(); err != nil {
		return err
	}
	return tx.validateTables()
}

// load adds a saved farm as it is, without validating it (loadSaved).
func (tx *Txn) load(f model.Farm) {
	nf := f.Clone()
	nf.Seal()
	tx.mark(nf.Name)
	tx.farms[nf.Name] = &nf
}

// withoutInvalid drops from l's state the invalid farms, which move to the
// farms set aside: the kernel refused the state with them.
func (l *loaded) withoutInvalid(e *Engine, kernelErr error) {
	tx := e.begin(l.state)
	for _, f := range l.state.Farms() {
		if why, bad := l.invalid[f.Name]; bad {
			tx.mark(f.Name)
			tx.farms[f.Name] = nil
			raw := f.AppendJSON(nil)
			l.setAside(store.SavedFarm{Name: f.Name, Raw: raw, Farm: *f},
				fmt.Sprintf("%s; the kernel refused the saved state with it (%v)", why, kernelErr))
		}
	}
	clear(l.invalid)
	l.state = tx.build(tx.diff())
}

// keepAside carries the farms an earlier attempt set aside into l (a
// reload after UndoLast): they stay out of the state.
func (l *loaded) keepAside(e *Engine, earlier *loaded) {
	for _, sf := range earlier.aside {
		if slices.ContainsFunc(l.aside, func(x store.SavedFarm) bool { return x.Name == sf.Name }) {
			continue
		}
		if _, ok := l.state.Farm(sf.Name); !ok {
			continue // the undo took it away
		}
		delete(l.invalid, sf.Name)
		l.setAside(sf, earlier.why[sf.Name])
	}
	if len(earlier.aside) > 0 {
		tx := e.begin(l.state)
		for _, sf := range l.aside {
			if _, ok := tx.base.Farm(sf.Name); ok {
				tx.mark(sf.Name)
				tx.farms[sf.Name] = nil
			}
		}
		l.state = tx.build(tx.diff())
	}
}

// report sets aside what l says to, logs every problem and publishes the
// list.
func (e *Engine) report(ctx context.Context, l *loaded) {
	var problems []Problem
	if len(l.aside) > 0 {
		files, err := e.store.(store.SavedLoader).SetAside(ctx, l.aside)
		if err != nil {
			// The farms stay in the saved state, out of the served one;
			// the daemon still serves (a full disk, say).
			e.log.Error("could not move unloadable saved farms out of the saved state; they stay there, not served", "err", err)
		}
		for _, sf := range l.aside {
			p := Problem{Farm: sf.Name, Problem: l.why[sf.Name], File: files[sf.Name]}
			e.log.Warn("saved farm set aside: not loaded", "farm", sf.Name, "problem", p.Problem, "file", p.File)
			problems = append(problems, p)
		}
	}
	for _, f := range l.state.Farms() {
		if why, bad := l.invalid[f.Name]; bad {
			e.log.Warn("saved farm loaded as saved but no longer valid; fix it through the API", "farm", f.Name, "problem", why)
			problems = append(problems, Problem{Farm: f.Name, Loaded: true, Problem: why})
		}
	}
	slices.SortFunc(problems, func(a, b Problem) int {
		switch {
		case a.Farm < b.Farm:
			return -1
		case a.Farm > b.Farm:
			return 1
		}
		return 0
	})
	e.problems.Store(&problems)
}
