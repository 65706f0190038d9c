package kube

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

// An annotation is a request to serve a Service differently, never a
// condition of serving it: whatever its annotations say, a Service follows
// its endpoints. So each Service is put into a transaction in steps, each
// taken only if the one before is refused:
//
//  1. the farms its annotations make (step skipped without annotations);
//  2. the default farms (no annotation applied);
//  3. every default farm that is accepted on its own; a refused one (e.g.
//     an SCTP port on a data plane without SCTP, an address another
//     Service already serves) is left out, and deleted if it was there,
//     so it cannot keep serving endpoints that are gone.
//
// What was refused on the way is reported as a Warning Event and a log
// line (see report).

// servicePlan is what one Service should have in the engine.
type servicePlan struct {
	key string
	svc *corev1.Service // nil when the Service is gone
	eps []*discoveryv1.EndpointSlice
	// annotated are the farms with the Service's annotations applied; nil
	// when it has none that change anything, or they do not parse.
	annotated []model.Farm
	// defaults are the farms without annotations.
	defaults []model.Farm
	// annErr is the annotation that does not parse (the defaults serve).
	annErr error
	// err is a failure to translate the Service at all (it gets no farms).
	err error
	// ranges is its loadBalancerSourceRanges allow list (sourceranges.go),
	// nil without one; rangesRefused why it was refused.
	ranges        *sourceRanges
	rangesRefused error
	// node is what the farms were translated for.
	node Node
}

// outcome is what a Service got, and what was refused on the way.
type outcome struct {
	names []string // farms the Service has in the engine now
	// annRefused: the annotated farms were refused, the defaults serve.
	annRefused error
	// farmRefused: default farms left out, one error each.
	farmRefused []error
}

// newPlan translates one Service.
func newPlan(key string, svc *corev1.Service, eps []*discoveryv1.EndpointSlice, node Node) *servicePlan {
	p := &servicePlan{key: key, svc: svc, eps: eps, node: node}
	if svc == nil {
		return p
	}
	p.defaults, p.err = DefaultFarms(svc, eps, node)
	if p.err != nil {
		return p
	}
	set, aerr := parseAnnotations(svc.Annotations)
	switch {
	case aerr != nil:
		p.annErr = aerr
	case set.any():
		p.annotated, p.err = buildFarms(svc, eps, node, &set)
	}
	if p.err == nil {
		p.ranges, p.err = parseSourceRanges(svc, node)
	}
	if p.ranges != nil {
		p.ranges.attach(p.defaults)
		p.ranges.attach(p.annotated)
	}
	p.defaults, p.annotated = dropPodsFarmsBesidePolicies(p.defaults), dropPodsFarmsBesidePolicies(p.annotated)
	return p
}

// put puts the Service's farms into tx, stepping down as described above
// while tx.Put refuses them. With noAnnotations step 1 is skipped (its
// farms were accepted by Put but refused when the transaction committed).
func (p *servicePlan) put(tx *engine.Txn, noAnnotations bool) (outcome, error) {
	var o outcome
	if p.err != nil {
		o.farmRefused = append(o.farmRefused, p.err)
		return o, nil
	}
	refused, err := p.prepareRanges(tx)
	if err != nil {
		return o, err
	}
	if err := p.prepareDropAll(tx); err != nil {
		return o, err
	}
	if err := p.prepareClusterCIDR(tx, p.node); err != nil {
		return o, err
	}
	if refused != nil {
		p.rangesRefused = refused
	}
	if p.rangesRefused != nil {
		o.farmRefused = append(o.farmRefused, p.rangesRefused)
	}
	if p.annotated != nil && !noAnnotations {
		err := putFarms(tx, p.annotated)
		if err == nil {
			o.names = farmNames(p.annotated)
			return o, nil
		}
		if !isRejection(err) {
			return o, err
		}
		o.annRefused = err
	}
	if err := putFarms(tx, p.defaults); err == nil {
		o.names = farmNames(p.defaults)
		return o, nil
	} else if !isRejection(err) {
		return o, err
	}
	for i := range p.defaults {
		f := &p.defaults[i]
		err := tx.Put(*f)
		if err == nil {
			o.names = append(o.names, f.Name)
			continue
		}
		if !isRejection(err) {
			return o, err
		}
		o.farmRefused = append(o.farmRefused, err)
		if _, ok := tx.Get(f.Name); ok {
			if err := tx.Delete(f.Name); err != nil {
				return o, err
			}
		}
	}
	return o, nil
}

// putFarms puts farms into tx; if one is refused, those put so far are
// taken back to what tx held before, so the farms go in all or nothing.
func putFarms(tx *engine.Txn, farms []model.Farm) error {
	before := make([]*model.Farm, len(farms))
	for i := range farms {
		before[i], _ = tx.Get(farms[i].Name)
		if err := tx.Put(farms[i]); err != nil {
			for j := i - 1; j >= 0; j-- {
				if before[j] != nil {
					_ = tx.Put(*before[j]) // it was accepted before
				} else {
					_ = tx.Delete(farms[j].Name)
				}
			}
			return err
		}
	}
	return nil
}

func farmNames(farms []model.Farm) []string {
	out := make([]string, len(farms))
	for i := range farms {
		out[i] = farms[i].Name
	}
	return out
}

// deleteOthers deletes from tx the farms in owned that are not in keep.
func deleteOthers(tx *engine.Txn, owned, keep []string) error {
	for _, n := range owned {
		if slices.Contains(keep, n) {
			continue
		}
		if _, ok := tx.Get(n); ok {
			if err := tx.Delete(n); err != nil {
				return err
			}
		}
	}
	return nil
}

// problems returns the Event reason and message for what the Service did
// not get, or "" when it got everything it asked for.
func (p *servicePlan) problems(o outcome) (reason, msg string) {
	var parts []string
	reason = ReasonRejected
	if p.annErr != nil {
		reason = ReasonInvalidAnnotation
		parts = append(parts, p.annErr.Error()+"; serving with the defaults (no annotation applied)")
	}
	if o.annRefused != nil {
		parts = append(parts, "the annotations' settings are refused: "+o.annRefused.Error()+"; serving with the defaults (no annotation applied)")
	}
	for _, err := range o.farmRefused {
		parts = append(parts, "not programmed: "+err.Error())
	}
	if len(parts) == 0 {
		return "", ""
	}
	return reason, strings.Join(parts, "; ")
}

// isRejection reports whether err is the engine refusing a farm (a bad
// value, something the data plane cannot do, a clash with another farm) as
// opposed to a failure of the kernel or the disk.
func isRejection(err error) bool {
	var fe *model.FieldError
	var ce *engine.ConflictError
	var ae *AnnotationError
	var ue *UnsupportedError
	return errors.As(err, &fe) || errors.As(err, &ce) || errors.As(err, &ae) || errors.As(err, &ue)
}

// errFarm wraps a refusal with the farm it is about, when the error does
// not name it already.
func errFarm(name string, err error) error {
	if strings.Contains(err.Error(), name) {
		return err
	}
	return fmt.Errorf("farm %q: %w", name, err)
}
