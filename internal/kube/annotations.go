package kube

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/xlb-lb/xlb/internal/model"
)

// Annotation prefixes. Keys under xlbPrefix are xlb's own; keys under
// nftlbPrefix are kube-nftlb's, accepted with the same meanings so its users
// can switch without editing manifests.
const (
	xlbPrefix   = "xlb.io/"
	nftlbPrefix = "service.kubernetes.io/kube-nftlb-load-balancer-"
)

// annotationKeys are the settings both prefixes accept, and the farm field
// each one sets (its values are nftlb's, see docs/kube-proxy.md).
var annotationKeys = []string{"mode", "scheduler", "sched-param", "persistence", "persist-ttl", "helper", "log", "est-connlimit", "iface", "check"}

// xlbOnlyKeys are the keys only the xlb.io/ prefix takes (kube-nftlb had
// no health checks).
var xlbOnlyKeys = []string{"check"}

// AnnotationError says which annotation of a Service has a bad value.
type AnnotationError struct {
	Key     string
	Value   string
	Problem string
}

func (e *AnnotationError) Error() string {
	return fmt.Sprintf("annotation %q value %q: %s", e.Key, e.Value, e.Problem)
}

// settings are the farm fields a Service's annotations override. A nil
// pointer keeps the default.
type settings struct {
	mode         *model.Mode
	scheduler    *model.Scheduler
	schedParam   *model.HashKey
	persistence  *model.HashKey
	persistTTL   *uint32
	helper       *model.Helper
	log          *model.LogHook
	estConnLimit *uint32
	iface        *string
	// check: xlb.io/check, a health check object as the API takes it
	// (docs/health.md), added to each farm of the Service.
	check *model.Check
}

// any reports whether an annotation changes a farm field.
func (s *settings) any() bool { return *s != settings{} }

// parseAnnotations reads the xlb.io/ and kube-nftlb annotations. The xlb.io/
// key wins when both spell the same setting; an unknown xlb.io/ key is an
// error (a typo would otherwise be ignored silently).
func parseAnnotations(ann map[string]string) (settings, error) {
	var s settings
	// Sorted keys: the first error reported is the same on every run.
	keys := make([]string, 0, len(ann))
	for k := range ann {
		if strings.HasPrefix(k, xlbPrefix) || strings.HasPrefix(k, nftlbPrefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	known := func(name string) bool {
		for _, k := range annotationKeys {
			if k == name {
				return true
			}
		}
		return false
	}
	for _, k := range keys {
		name, own := strings.CutPrefix(k, xlbPrefix)
		if !own {
			name = strings.TrimPrefix(k, nftlbPrefix)
			if _, dup := ann[xlbPrefix+name]; dup && known(name) {
				continue // the xlb.io/ key wins
			}
		}
		if !own && slices.Contains(xlbOnlyKeys, name) {
			continue
		}
		if !known(name) {
			if own {
				return s, &AnnotationError{Key: k, Value: ann[k], Problem: "unknown xlb.io annotation; allowed: " + allowedKeys()}
			}
			continue // another kube-nftlb key xlb has no use for
		}
		if err := s.set(name, strings.TrimSpace(ann[k])); err != nil {
			return s, &AnnotationError{Key: k, Value: ann[k], Problem: err.Error()}
		}
	}
	return s, nil
}

func allowedKeys() string {
	out := make([]string, len(annotationKeys))
	for i, k := range annotationKeys {
		out[i] = xlbPrefix + k
	}
	return strings.Join(out, ", ")
}

// set parses one setting with the model's own parser, so the allowed values
// and their texts are the model's.
func (s *settings) set(name, v string) error {
	if name == "check" {
		return s.setCheck(v)
	}
	f := model.NewFarm("annotation")
	if name == "scheduler" {
		if keys, ok := strings.CutPrefix(v, "hash-"); ok {
			return s.setHashScheduler(keys)
		}
	}
	if err := f.SetField(name, v); err != nil {
		return err
	}
	switch name {
	case "mode":
		s.mode = &f.Mode
	case "scheduler":
		s.scheduler = &f.Scheduler
		if (f.Scheduler == model.SchedHash || f.Scheduler == model.SchedSymhash) && s.schedParam == nil {
			k := model.KeySrcIP // nftlb's default keys for the hash schedulers
			s.schedParam = &k
		}
	case "iface":
		s.iface = &f.Iface
	case "sched-param":
		s.schedParam = &f.SchedParam
	case "persistence":
		s.persistence = &f.Persistence
	case "persist-ttl":
		s.persistTTL = &f.PersistTTL
	case "helper":
		s.helper = &f.Helper
	case "log":
		s.log = &f.Log
	case "est-connlimit":
		s.estConnLimit = &f.EstConnLimit
	}
	return nil
}

// setCheck reads xlb.io/check: a JSON check object, e.g.
// {"type":"http","path":"/healthz"}, decoded by the model as the API's
// "check" member is. Values that need the farm (a port, the family of a
// source address) are checked when the farm is: a farm refused for them
// falls back to the defaults like any refused annotation.
func (s *settings) setCheck(v string) error {
	fs, err := model.DecodeFarmsUnchecked([]byte(`{"name":"annotation","check":` + v + `}`))
	if err != nil {
		var fe *model.FieldError
		if errors.As(err, &fe) {
			return fmt.Errorf("field %q: %s", fe.Field, fe.Problem)
		}
		return fmt.Errorf("must be a JSON check object, e.g. {\"type\": \"http\", \"path\": \"/healthz\"}: %v", err)
	}
	if fs[0].Check == nil {
		return errors.New(`must be a JSON check object, e.g. {"type": "http", "path": "/healthz"}`)
	}
	s.check = fs[0].Check
	return nil
}

// setHashScheduler reads kube-nftlb's scheduler values hash-<key>[-<key>...]
// ("hash-srcip", "hash-srcip-srcport"): its README documents them, as the
// hash scheduler over those keys, because kube-nftlb had no sched-param
// annotation.
func (s *settings) setHashScheduler(keys string) error {
	f := model.NewFarm("annotation")
	if err := f.SetField("sched-param", strings.ReplaceAll(keys, "-", " ")); err != nil {
		return fmt.Errorf("hash-<keys>: the keys after hash- joined by '-': %w", err)
	}
	sched := model.SchedHash
	s.scheduler = &sched
	s.schedParam = &f.SchedParam
	return nil
}

// override sets the overridden fields on a farm.
//
// Modes dsr and stlsdnat keep no connection state, so they pick a backend
// for every packet: unless the scheduler annotation says otherwise, they
// hash the flow (hash over srcip srcport) instead of the default rr, which
// would send each packet of a connection elsewhere; and sessionAffinity
// ClientIP becomes a hash over the client's address (the same backend for
// every connection of a client, without a timeout) instead of persistence,
// which these modes cannot keep.
func (s *settings) override(f *model.Farm) {
	if s.mode != nil {
		f.Mode = *s.mode
	}
	if (f.Mode == model.ModeDSR || f.Mode == model.ModeStlsDNAT) && s.scheduler == nil {
		f.Scheduler, f.SchedParam = model.SchedHash, model.KeySrcIP|model.KeySrcPort
		if f.Persistence == model.KeySrcIP && s.persistence == nil {
			f.SchedParam, f.Persistence, f.PersistTTL = model.KeySrcIP, 0, model.DefaultTTL
		}
	}
	if s.iface != nil {
		f.Iface = *s.iface
	}
	if s.scheduler != nil {
		f.Scheduler = *s.scheduler
	}
	if s.schedParam != nil {
		f.SchedParam = *s.schedParam
	}
	if s.persistence != nil {
		f.Persistence = *s.persistence
	}
	if s.persistTTL != nil {
		f.PersistTTL = *s.persistTTL
	}
	if s.helper != nil && s.helper.Handles(f.Protocol) {
		// A Service asks once for all its ports (DNS has a TCP and a UDP
		// one): the helper goes to those of the protocol it handles.
		f.Helper = *s.helper
	}
	if s.log != nil {
		f.Log = *s.log
	}
	if s.estConnLimit != nil {
		f.EstConnLimit = *s.estConnLimit
	}
	if s.check != nil {
		f.Check = s.check
	}
}
