package crd

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

// Reasons of the Programmed condition.
const (
	ReasonProgrammed = "Programmed"
	// ReasonInvalid: the model's validators refused the object on its
	// own (a bad field or value).
	ReasonInvalid = "Invalid"
	// ReasonRefused: valid on its own, refused by the engine against the
	// node's other objects or by its data plane.
	ReasonRefused = "Refused"
)

// farmWant is a Farm resource as the engine should have it: its spec with
// its name and the Check resources for it merged in, decoded.
type farmWant struct {
	obj    *unstructured.Unstructured
	body   string // the farm object given to the model's decoder
	farm   model.Farm
	checks []objKey // Check resources merged into body
}

type tableWant struct {
	obj  *unstructured.Unstructured
	body string
	decl model.TableDecl
}

// checkTarget is what a Check resource checks: a farm, or one backend.
type checkTarget struct{ farm, backend string }

type checkWant struct {
	key  objKey
	spec map[string]any // the check object: spec without farm, backend
}

// desired is what the resources ask of the engine, and the outcome of
// the objects already decided (invalid ones).
type desired struct {
	farms  map[string]*farmWant
	tables map[string]*tableWant
	// exists: every resource by kind and name, valid or not.
	exists map[objKey]*unstructured.Unstructured
	out    map[objKey]outcome
}

func noFarm(string) (*model.Farm, bool)   { return nil, false }
func noTable(string) (*model.Table, bool) { return nil, false }

// specOf returns a deep copy of the object's spec.
func specOf(u *unstructured.Unstructured) (map[string]any, error) {
	spec, ok := u.Object["spec"].(map[string]any)
	if !ok {
		return nil, &model.FieldError{Field: "spec", Problem: "required: an object"}
	}
	return runtime.DeepCopyJSONValue(spec).(map[string]any), nil
}

// want decodes every resource with the model's decoders, as the REST API
// would decode the same object (a farm or table from scratch, not a patch).
func (c *Controller) want() *desired {
	d := &desired{farms: map[string]*farmWant{}, tables: map[string]*tableWant{},
		exists: map[objKey]*unstructured.Unstructured{}, out: map[objKey]outcome{}}
	invalid := func(k objKey, u *unstructured.Unstructured, err error) {
		d.out[k] = outcome{generation: u.GetGeneration(), reason: ReasonInvalid, message: err.Error()}
	}
	for _, u := range c.list(TableResource) {
		k := objKey{KindTable, u.GetName()}
		d.exists[k] = u
		spec, err := specOf(u)
		var b []byte
		if err == nil {
			spec["name"] = u.GetName()
			b, err = json.Marshal(spec)
		}
		var decl model.TableDecl
		if err == nil {
			decl, err = model.DecodeTable(b, u.GetName(), noTable, model.VocabTables)
		}
		if err != nil {
			invalid(k, u, err)
			continue
		}
		d.tables[u.GetName()] = &tableWant{obj: u, body: string(b), decl: decl}
	}
	checks := map[checkTarget]checkWant{}
	for _, u := range c.list(CheckResource) {
		k := objKey{KindCheck, u.GetName()}
		d.exists[k] = u
		spec, err := specOf(u)
		if err != nil {
			invalid(k, u, err)
			continue
		}
		farm, _ := spec["farm"].(string)
		backend, _ := spec["backend"].(string)
		if farm == "" {
			invalid(k, u, &model.FieldError{Field: "spec.farm", Problem: "required: the name of the Farm this check is for"})
			continue
		}
		delete(spec, "farm")
		delete(spec, "backend")
		t := checkTarget{farm, backend}
		if other, dup := checks[t]; dup {
			what := fmt.Sprintf("farm %q", farm)
			if backend != "" {
				what = fmt.Sprintf("backend %q of farm %q", backend, farm)
			}
			d.out[k] = outcome{generation: u.GetGeneration(), reason: ReasonRefused,
				message: fmt.Sprintf("check %q is for %s already; one Check per farm and per backend", other.key.name, what)}
			continue
		}
		checks[t] = checkWant{key: k, spec: spec}
	}
	for _, u := range c.list(FarmResource) {
		k := objKey{KindFarm, u.GetName()}
		d.exists[k] = u
		fw, err := c.wantFarm(u, checks, d)
		if err != nil {
			invalid(k, u, err)
			for _, ck := range fw.checks {
				d.out[ck] = outcome{generation: d.exists[ck].GetGeneration(), reason: ReasonRefused,
					message: fmt.Sprintf("farm %q is invalid: %v", u.GetName(), err)}
			}
			continue
		}
		d.farms[u.GetName()] = fw
	}
	for t, cw := range checks {
		if _, ok := d.exists[objKey{KindFarm, t.farm}]; !ok {
			d.out[cw.key] = outcome{generation: d.exists[cw.key].GetGeneration(), reason: ReasonRefused,
				message: fmt.Sprintf("there is no Farm %q", t.farm)}
		}
	}
	return d
}

// wantFarm merges the Check resources for farm u into its spec and decodes
// the result.
func (c *Controller) wantFarm(u *unstructured.Unstructured, checks map[checkTarget]checkWant, d *desired) (*farmWant, error) {
	fw := &farmWant{obj: u}
	spec, err := specOf(u)
	if err != nil {
		return fw, err
	}
	name := u.GetName()
	refuse := func(ck objKey, msg string, args ...any) {
		d.out[ck] = outcome{generation: d.exists[ck].GetGeneration(), reason: ReasonRefused, message: fmt.Sprintf(msg, args...)}
	}
	// Backends by name, for their checks.
	backends := map[string]map[string]any{}
	if bl, ok := spec["backends"].([]any); ok {
		for _, b := range bl {
			if bm, ok := b.(map[string]any); ok {
				if n, ok := bm["name"].(string); ok {
					backends[n] = bm
				}
			}
		}
	}
	targets := slices.SortedFunc(maps.Keys(checks), func(a, b checkTarget) int {
		if a.farm != b.farm {
			return strings.Compare(a.farm, b.farm)
		}
		return strings.Compare(a.backend, b.backend)
	})
	for _, t := range targets {
		if t.farm != name {
			continue
		}
		cw := checks[t]
		into := spec
		if t.backend != "" {
			b, ok := backends[t.backend]
			if !ok {
				refuse(cw.key, "farm %q has no backend %q", name, t.backend)
				continue
			}
			into = b
		}
		if _, has := into["check"]; has {
			refuse(cw.key, "farm %q sets the check of this %s in its own spec: a check comes from the spec or from one Check, not both",
				name, map[bool]string{true: "backend", false: "farm"}[t.backend != ""])
			continue
		}
		into["check"] = cw.spec
		fw.checks = append(fw.checks, cw.key)
	}
	spec["name"] = name
	b, err := json.Marshal(spec)
	if err != nil {
		return fw, err
	}
	fw.body = string(b)
	fs, err := model.DecodeFarms(b, noFarm)
	if err != nil {
		return fw, err
	}
	if len(fs) != 1 {
		return fw, fmt.Errorf("the spec decodes to %d farms, want one", len(fs))
	}
	fw.farm = fs[0]
	return fw, nil
}

// sync programs what the resources ask and reports what it did. It
// returns true when something should be tried again later (a status that
// could not be written, an engine change that failed for a reason other
// than the object).
func (c *Controller) sync(ctx context.Context) (again bool) {
	d := c.want()
	eng := c.cfg.Engine
	programmed := func(k objKey) {
		d.out[k] = outcome{generation: d.exists[k].GetGeneration(), ok: true, reason: ReasonProgrammed,
			message: fmt.Sprintf("node %s programmed generation %d", c.cfg.Node, d.exists[k].GetGeneration())}
	}
	refused := func(k objKey, err error) {
		msg := err.Error()
		if prev, ok := c.appliedGen[k]; ok {
			msg += fmt.Sprintf(" (node %s keeps generation %d)", c.cfg.Node, prev)
		}
		d.out[k] = outcome{generation: d.exists[k].GetGeneration(), reason: ReasonRefused, message: msg}
	}
	done := func(k objKey, body string) {
		c.applied[k] = body
		c.appliedGen[k] = d.exists[k].GetGeneration()
		programmed(k)
	}

	// 1. Farms whose resource is gone.
	snap := eng.Snapshot()
	var gone []string
	for _, f := range snap.Farms() {
		if _, ok := d.exists[objKey{KindFarm, f.Name}]; !ok {
			gone = append(gone, f.Name)
		}
	}
	if len(gone) > 0 {
		_, err := eng.Change(ctx, func(tx *engine.Txn) error {
			for _, n := range gone {
				if err := tx.Delete(n); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			c.cfg.Log.Error("remove farms whose resource was deleted", "farms", gone, "err", err)
			again = true
		} else {
			c.cfg.Log.Info("farms removed: their resources were deleted", "farms", gone)
			for _, n := range gone {
				delete(c.applied, objKey{KindFarm, n})
				delete(c.appliedGen, objKey{KindFarm, n})
			}
		}
	}

	// 2. Tables, each in a change of its own.
	for _, name := range slices.Sorted(maps.Keys(d.tables)) {
		tw, k := d.tables[name], objKey{KindTable, name}
		if c.applied[k] == tw.body {
			programmed(k)
			continue
		}
		_, err := eng.Change(ctx, func(tx *engine.Txn) error {
			if err := tx.PutTable(tw.decl.Table); err != nil {
				return err
			}
			return tx.ReplaceEntries(name, tw.decl.Entries)
		})
		if err != nil {
			refused(k, err)
			continue
		}
		done(k, tw.body)
	}

	// 3. Farms: the changed ones in one change; if the engine refuses
	// it, one change each, so that one bad farm holds back no other.
	var put []string
	for _, name := range slices.Sorted(maps.Keys(d.farms)) {
		if c.applied[objKey{KindFarm, name}] == d.farms[name].body {
			programmed(objKey{KindFarm, name})
		} else {
			put = append(put, name)
		}
	}
	putFarms := func(names []string) error {
		_, err := eng.Change(ctx, func(tx *engine.Txn) error {
			for _, n := range names {
				if err := tx.Put(d.farms[n].farm); err != nil {
					return err
				}
			}
			return nil
		})
		return err
	}
	if len(put) > 0 {
		if err := putFarms(put); err == nil {
			for _, n := range put {
				done(objKey{KindFarm, n}, d.farms[n].body)
			}
		} else {
			// One by one, again while some go in: a farm may wait for
			// another's change (a VIP moved from one farm to another).
			errs := map[string]error{}
			if len(put) == 1 {
				errs[put[0]] = err
			}
			for progress := len(put) > 1; progress; {
				progress = false
				for _, n := range put {
					if c.applied[objKey{KindFarm, n}] == d.farms[n].body {
						continue // in already
					}
					if err := putFarms([]string{n}); err != nil {
						errs[n] = err
						continue
					}
					delete(errs, n)
					done(objKey{KindFarm, n}, d.farms[n].body)
					progress = true
				}
			}
			for n, err := range errs {
				refused(objKey{KindFarm, n}, err)
			}
		}
	}
	// A Check's outcome is its farm's.
	for _, fw := range d.farms {
		fo := d.out[objKey{KindFarm, fw.obj.GetName()}]
		for _, ck := range fw.checks {
			o := outcome{generation: d.exists[ck].GetGeneration(), ok: fo.ok, reason: fo.reason, message: fo.message}
			if fo.ok {
				o.message = fmt.Sprintf("node %s programmed it in farm %q", c.cfg.Node, fw.obj.GetName())
			} else {
				o.message = fmt.Sprintf("farm %q: %s", fw.obj.GetName(), fo.message)
			}
			d.out[ck] = o
		}
	}

	// 4. Tables whose resource is gone (after the farms that used them).
	for _, t := range eng.Snapshot().Tables() {
		k := objKey{KindTable, t.Name}
		if _, ok := d.exists[k]; ok {
			continue
		}
		_, err := eng.Change(ctx, func(tx *engine.Txn) error { return tx.DestroyTable(t.Name) })
		if err != nil {
			// Still attached by a farm that keeps an older generation
			// (its new one was refused): tried again on the next change.
			c.cfg.Log.Warn("remove a table whose resource was deleted", "table", t.Name, "err", err)
			continue
		}
		c.cfg.Log.Info("table removed: its resource was deleted", "table", t.Name)
		delete(c.applied, k)
		delete(c.appliedGen, k)
	}

	if c.report(ctx, d) {
		again = true
	}
	return again
}
