package crd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/xlb-lb/xlb/internal/engine"
)

// Config is what a Controller needs.
type Config struct {
	Log    *slog.Logger
	Client dynamic.Interface
	Engine *engine.Engine
	// Node names this node in the resources' status and in Events.
	Node string
	// Resync is the informers' resync period (0: none; a watch that
	// breaks is re-listed by client-go whatever this is).
	Resync time.Duration
	// Wait bounds how long Ready waits for the first sync with the API
	// server (0: no bound).
	Wait time.Duration
}

// Controller programs the Farm, Table and Check resources into one node's
// engine and reports per object what it did.
type Controller struct {
	cfg     Config
	factory dynamicinformer.DynamicSharedInformerFactory
	wake    chan struct{}

	// applied holds, per farm and table, the body last programmed (what
	// the engine took); an object whose body has not changed since is
	// not sent again.
	applied map[objKey]string
	// appliedGen is the generation of that body.
	appliedGen map[objKey]int64
	// reported is the status last written per object (status.go).
	reported map[objKey]outcome
	// synced is closed after the first pass over synced informers.
	synced chan struct{}

	gateMu  sync.Mutex
	ready   bool // first pass done, or Wait over
	changed chan struct{}
}

// objKey names one object: its kind and metadata.name.
type objKey struct{ kind, name string }

func (k objKey) String() string { return k.kind + "/" + k.name }

// New makes a controller; Run starts it.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Engine == nil || cfg.Log == nil {
		return nil, errors.New("crd controller: client, engine and logger are required")
	}
	if cfg.Node == "" {
		return nil, errors.New("crd controller: a node name is required")
	}
	return &Controller{
		cfg:        cfg,
		factory:    dynamicinformer.NewDynamicSharedInformerFactory(cfg.Client, cfg.Resync),
		wake:       make(chan struct{}, 1),
		applied:    map[objKey]string{},
		appliedGen: map[objKey]int64{},
		reported:   map[objKey]outcome{},
		synced:     make(chan struct{}),
		changed:    make(chan struct{}, 1),
	}, nil
}

// Ready reports whether the node has programmed what the API server held
// when the controller started (or waited Config.Wait for it): the BGP
// speaker announces nothing before (bgp.Gate), so a node that restarts
// does not announce a farm deleted while it was down.
func (c *Controller) Ready() (bool, string) {
	c.gateMu.Lock()
	defer c.gateMu.Unlock()
	if c.ready {
		return true, ""
	}
	return false, "custom resources: waiting for the first sync with the Kubernetes API server"
}

// Changed is signalled when Ready may have changed (bgp.Gate).
func (c *Controller) Changed() <-chan struct{} { return c.changed }

func (c *Controller) open(why string) {
	c.gateMu.Lock()
	was := c.ready
	c.ready = true
	c.gateMu.Unlock()
	if was {
		return
	}
	if why != "" {
		c.cfg.Log.Warn(why)
	}
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// Synced is closed once the controller has programmed what the informers
// held when they first synced.
func (c *Controller) Synced() <-chan struct{} { return c.synced }

func (c *Controller) kick() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Run watches the resources and programs them until ctx ends. Nothing is
// removed from the engine before the informers have synced.
func (c *Controller) Run(ctx context.Context) error {
	var syncs []cache.InformerSynced
	for _, r := range []schema.GroupVersionResource{FarmResource, TableResource, CheckResource} {
		inf := c.factory.ForResource(r).Informer()
		_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { c.kick() },
			UpdateFunc: func(any, any) { c.kick() },
			DeleteFunc: func(any) { c.kick() },
		})
		if err != nil {
			return fmt.Errorf("watch %s: %w", r.Resource, err)
		}
		syncs = append(syncs, inf.HasSynced)
	}
	c.factory.Start(ctx.Done())
	defer c.factory.Shutdown()
	if c.cfg.Wait > 0 {
		t := time.AfterFunc(c.cfg.Wait, func() {
			c.open("no first sync with the Kubernetes API server within the wait: announcing the saved state")
		})
		defer t.Stop()
	}
	c.cfg.Log.Info("watching xlb custom resources", "group", Group, "version", Version, "node", c.cfg.Node)
	if !cache.WaitForCacheSync(ctx.Done(), syncs...) {
		return ctx.Err()
	}
	// Retries: status writes that failed, objects refused (the engine
	// may take them once another object changes; an event wakes the
	// loop then, this bounds the wait when none comes).
	retry := time.NewTimer(0)
	defer retry.Stop()
	first := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.wake:
		case <-retry.C:
		}
		again := c.sync(ctx)
		if first {
			close(c.synced)
			c.open("")
			first = false
		}
		if !retry.Stop() {
			select {
			case <-retry.C:
			default:
			}
		}
		if again {
			retry.Reset(5 * time.Second)
		}
	}
}

// list returns the informer's objects of a resource, sorted by name.
func (c *Controller) list(res schema.GroupVersionResource) []*unstructured.Unstructured {
	objs, err := c.factory.ForResource(res).Lister().List(labels.Everything())
	if err != nil {
		c.cfg.Log.Warn("list custom resources", "resource", res.Resource, "err", err)
		return nil
	}
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		if u, ok := o.(*unstructured.Unstructured); ok {
			out = append(out, u)
		}
	}
	slices.SortFunc(out, func(a, b *unstructured.Unstructured) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out
}
