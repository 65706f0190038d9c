package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

// Labels kube-proxy honours: a Service with service-proxy-name belongs to
// another proxy; EndpointSlices name their Service with service-name; headless
// Services' slices carry the headless label and need no proxying.
const (
	labelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	labelHeadless         = "service.kubernetes.io/headless"
	sliceIndex            = "xlb-service"
)

// Event reasons recorded on Services.
const (
	ReasonInvalidAnnotation = "XLBInvalidAnnotation"
	ReasonRejected          = "XLBRejected"
	ReasonSynced            = "XLBSynced"
)

// Config configures a Controller.
type Config struct {
	Client kubernetes.Interface
	Engine *engine.Engine
	Log    *slog.Logger
	// NodeName is this node's name (--hostname-override): it picks local
	// endpoints and the Node whose addresses serve NodePorts.
	NodeName string
	// NodePortAddresses restricts NodePorts to node addresses inside these
	// prefixes (kube-proxy's --nodeport-addresses CIDRs, "localhost" and
	// "all"); empty means every address in the Node's status. With
	// InterfaceAddrs the addresses are the node's interfaces' (see
	// nodeaddrs.go).
	NodePortAddresses []netip.Prefix
	// NodePortPrimary serves NodePorts on the Node's primary addresses
	// (kube-proxy's --nodeport-addresses primary): its first InternalIP of
	// each family, else its first ExternalIP.
	NodePortPrimary bool
	// InterfaceAddrs, if set, lists and watches the node's interface
	// addresses (ifaddr.Source in the data plane's namespace), which
	// NodePortAddresses then filters, as kube-proxy does.
	InterfaceAddrs AddrSource
	// MasqueradeAll masquerades all traffic to cluster IPs (kube-proxy's
	// masqueradeAll): cluster farms in snat mode.
	MasqueradeAll bool
	// ClusterCIDRs is kube-proxy's clusterCIDR (clustercidr.go).
	ClusterCIDRs []netip.Prefix
	// PodInterface is the interface Pods' traffic arrives on, where mode
	// dsr for cluster IPs works (see Node.PodInterface).
	PodInterface string
	// Metrics, if set, receives sync timings.
	Metrics *Metrics
	// Flows, if set, deletes the tracked UDP flows of endpoints that
	// went away (both data planes can: dataplane.FlowFlusher).
	Flows dataplane.FlowFlusher
	// Listen opens the health check node port listeners (default
	// net.Listen).
	Listen ListenFunc
	// APIHost and WaitHint are logged, with the API server's answer, every
	// WaitLogInterval (default 5s) while the informer caches are not
	// synced (see waitLogger).
	APIHost         string
	WaitHint        string
	WaitLogInterval time.Duration
	// ErrorBackoff bounds how long a failed sync waits before the full
	// reconcile that follows it (default 1s to 30s, doubling).
	ErrorBackoffMax time.Duration
}

// Controller keeps the engine's farms in step with the API server: every
// change of a Service or its EndpointSlices becomes one engine transaction on
// that Service's farms only. A full reconcile (every Service in one
// transaction that replaces the whole state) runs at start and after a
// failure that may have left the kernel out of step; there is no periodic
// resync.
type Controller struct {
	cfg          Config
	log          *slog.Logger
	factory      informers.SharedInformerFactory
	sliceFactory informers.SharedInformerFactory
	nodeInf      informers.SharedInformerFactory
	services     corelisters.ServiceLister
	slices       cache.Indexer
	synced       []cache.InformerSynced
	queue        workqueue.TypedRateLimitingInterface[string]
	recorder     record.EventRecorder
	bcast        record.EventBroadcaster
	hc           *healthChecks

	nodeMu sync.Mutex
	node   Node
	// lastNode is the Node as last seen (nil: none); refreshMu orders
	// the address refreshes of the Node informer and the interface watch.
	lastNode  *corev1.Node
	refreshMu sync.Mutex
	// nodeIneligible: the Node is gone, being deleted or tainted for
	// deletion (proxyhealth.go).
	nodeIneligible bool
	started        time.Time

	// Owned by the worker goroutine.
	owned     map[string][]string // Service key -> farm names in the engine
	lastErr   map[string]string   // Service key -> last error reported as an Event
	needFull  bool
	fullDelay time.Duration

	stateMu   sync.Mutex
	ready     bool // first full reconcile done
	lastSync  time.Time
	onSynced  func(key string, st *engine.State)
	pendingAt map[string]time.Time
	// Service keys queued for a change of the Service / of its slices.
	svcPending, slicePending map[string]bool
}

// New builds a controller; Run starts it.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Engine == nil || cfg.Log == nil {
		return nil, errors.New("kube controller: Client, Engine and Log are required")
	}
	if cfg.NodeName == "" {
		return nil, errors.New("kube controller: the node name is required (--hostname-override)")
	}
	if cfg.ErrorBackoffMax <= 0 {
		cfg.ErrorBackoffMax = 30 * time.Second
	}
	c := &Controller{
		cfg:        cfg,
		log:        cfg.Log,
		node:       Node{Name: cfg.NodeName},
		started:    time.Now(),
		owned:      map[string][]string{},
		lastErr:    map[string]string{},
		pendingAt:  map[string]time.Time{},
		svcPending: map[string]bool{}, slicePending: map[string]bool{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, cfg.ErrorBackoffMax),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "xlb-kube-proxy"}),
	}
	// No resync period: the informers deliver changes only.
	c.factory = informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = "!" + labelServiceProxyName
		}))
	svcInf := c.factory.Core().V1().Services()
	c.services = svcInf.Lister()
	sliceFactory := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = discoveryv1.LabelServiceName + ",!" + labelHeadless
		}))
	sliceInf := sliceFactory.Discovery().V1().EndpointSlices().Informer()
	if err := sliceInf.AddIndexers(cache.Indexers{sliceIndex: func(obj any) ([]string, error) {
		s, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok {
			return nil, nil
		}
		return []string{s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]}, nil
	}}); err != nil {
		return nil, fmt.Errorf("index endpoint slices: %w", err)
	}
	c.slices = sliceInf.GetIndexer()
	c.nodeInf = informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", cfg.NodeName).String()
		}))
	nodeInf := c.nodeInf.Core().V1().Nodes().Informer()

	if _, err := svcInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.enqueueObj(obj, false) },
		UpdateFunc: func(_, obj any) { c.enqueueObj(obj, false) },
		DeleteFunc: func(obj any) { c.enqueueObj(obj, false) },
	}); err != nil {
		return nil, err
	}
	if _, err := sliceInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.enqueueSlice(obj) },
		UpdateFunc: func(_, obj any) { c.enqueueSlice(obj) },
		DeleteFunc: func(obj any) { c.enqueueSlice(obj) },
	}); err != nil {
		return nil, err
	}
	if _, err := nodeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.nodeChanged(obj) },
		UpdateFunc: func(_, obj any) { c.nodeChanged(obj) },
		DeleteFunc: func(any) { c.nodeChanged(nil) },
	}); err != nil {
		return nil, err
	}
	c.synced = []cache.InformerSynced{svcInf.Informer().HasSynced, sliceInf.HasSynced, nodeInf.HasSynced}
	c.sliceFactory = sliceFactory

	c.hc = newHealthChecks(cfg.Log, cfg.Listen)
	c.bcast = record.NewBroadcaster()
	c.recorder = c.bcast.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "xlb-kube-proxy", Host: cfg.NodeName})
	return c, nil
}

// Run starts the informers, waits for their caches, reconciles every
// Service in one transaction, then applies changes as they come until ctx
// ends. It returns nil when ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	defer c.hc.close()
	c.bcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.cfg.Client.CoreV1().Events("")})
	defer c.bcast.Shutdown()
	c.factory.Start(ctx.Done())
	c.sliceFactory.Start(ctx.Done())
	c.nodeInf.Start(ctx.Done())
	defer c.factory.Shutdown()
	defer c.sliceFactory.Shutdown()
	defer c.nodeInf.Shutdown()
	waitCtx, stopWaitLog := context.WithCancel(ctx)
	interval := c.cfg.WaitLogInterval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	go waitLogger(waitCtx, c.log, c.cfg.Client, c.cfg.APIHost, c.cfg.WaitHint, interval)
	synced := cache.WaitForCacheSync(ctx.Done(), c.synced...)
	stopWaitLog()
	if !synced {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("wait for the informer caches")
	}
	c.log.Info("informer caches synced")
	if err := c.watchInterfaces(ctx); err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	c.needFull = true
	for {
		if c.needFull {
			if err := c.fullSync(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				c.fullDelay = min(max(2*c.fullDelay, time.Second), c.cfg.ErrorBackoffMax)
				c.log.Error("full reconcile failed; retrying", "err", err, "retry_in", c.fullDelay)
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(c.fullDelay):
				}
				continue
			}
			c.fullDelay = 0
		}
		key, quit := c.queue.Get()
		if quit {
			return nil
		}
		err := c.syncService(ctx, key)
		c.queue.Done(key)
		if err != nil && ctx.Err() == nil {
			// The data plane or the store failed: the kernel may be out
			// of step, so reconcile everything before going on.
			c.log.Error("sync failed; full reconcile follows", "service", key, "err", err)
			c.cfg.Metrics.syncError()
			c.needFull = true
		}
	}
}

// Ready reports whether the first full reconcile has been done.
func (c *Controller) Ready() bool {
	c.stateMu.Lock()
	defer c.stateMu.Unlock()
	return c.ready
}

// Healthy reports whether the controller keeps up: ready, and either nothing
// is pending or the last sync is recent (kube-proxy's /healthz rule).
func (c *Controller) Healthy(maxAge time.Duration) (bool, string) {
	c.stateMu.Lock()
	defer c.stateMu.Unlock()
	if !c.ready {
		return false, "initial sync not done"
	}
	if n := c.queue.Len(); n > 0 && time.Since(c.lastSync) > maxAge {
		return false, fmt.Sprintf("%d changes pending, last sync %s ago", n, time.Since(c.lastSync).Round(time.Millisecond))
	}
	return true, "ok"
}

// OnSynced registers fn, called from the worker after each Service sync
// (key "" after a full reconcile) with the state it published. For tests
// and benchmarks; set it before Run.
func (c *Controller) OnSynced(fn func(key string, st *engine.State)) { c.onSynced = fn }

func (c *Controller) enqueueObj(obj any, slice bool) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		c.log.Warn("bad object from informer", "err", err)
		return
	}
	c.enqueueKind(key, slice)
}

func (c *Controller) enqueueSlice(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	name := s.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return
	}
	c.enqueueKind(s.Namespace+"/"+name, true)
}

// enqueueKind queues a Service key for a change of the Service or (slice)
// of one of its EndpointSlices, counted apart for kube-proxy's metrics.
func (c *Controller) enqueueKind(key string, slice bool) {
	now := time.Now()
	c.stateMu.Lock()
	if slice {
		c.slicePending[key] = true
	} else {
		c.svcPending[key] = true
	}
	sp, ep := len(c.svcPending), len(c.slicePending)
	c.stateMu.Unlock()
	c.cfg.Metrics.queued(slice, now, sp, ep)
	c.enqueue(key)
}

func (c *Controller) enqueue(key string) {
	c.stateMu.Lock()
	if _, ok := c.pendingAt[key]; !ok {
		c.pendingAt[key] = time.Now()
	}
	c.stateMu.Unlock()
	c.queue.Add(key)
	c.cfg.Metrics.setPending(c.queue.Len())
}

func (c *Controller) currentNode() Node {
	c.nodeMu.Lock()
	defer c.nodeMu.Unlock()
	return Node{Name: c.node.Name, Addrs: slices.Clone(c.node.Addrs), PodInterface: c.cfg.PodInterface, MasqueradeAll: c.cfg.MasqueradeAll, Zone: c.node.Zone, ClusterCIDRs: c.cfg.ClusterCIDRs}
}

// plan translates one Service from the informer caches (a plan without
// Service when it is gone).
func (c *Controller) plan(key string) (*servicePlan, error) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil, err
	}
	svc, err := c.services.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return newPlan(key, nil, nil, Node{}), nil
	}
	if err != nil {
		return nil, err
	}
	objs, err := c.slices.ByIndex(sliceIndex, key)
	if err != nil {
		return nil, err
	}
	eps := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			eps = append(eps, s)
		}
	}
	return newPlan(key, svc, eps, c.currentNode()), nil
}

// syncService makes the engine hold the farms of one Service, in one
// transaction, stepping down to the defaults, or to the farms that are
// accepted, when some are refused (see fallback.go). A Service never keeps
// farms with endpoints it no longer has. The returned error is only for
// failures of the kernel or the disk.
func (c *Controller) syncService(ctx context.Context, key string) error {
	start := time.Now()
	c.stateMu.Lock()
	queued, ok := c.pendingAt[key]
	delete(c.pendingAt, key)
	delete(c.svcPending, key)
	delete(c.slicePending, key)
	sp, ep := len(c.svcPending), len(c.slicePending)
	c.stateMu.Unlock()
	c.cfg.Metrics.pendingKinds(sp, ep)
	if !ok {
		queued = start
	}
	p, err := c.plan(key)
	if err != nil {
		return err
	}
	owned := c.owned[key]
	base := c.cfg.Engine.Snapshot() // this controller is the engine's only writer
	var o outcome
	commit := func(noAnnotations bool) (*engine.State, error) {
		return c.cfg.Engine.Change(ctx, func(tx *engine.Txn) error {
			var err error
			if o, err = p.put(tx, noAnnotations); err != nil {
				return err
			}
			if err := deleteOthers(tx, owned, o.names); err != nil {
				return err
			}
			return dropSourceRanges(tx, key, p.ranges)
		})
	}
	st, err := commit(false)
	var annRefused error
	if err != nil && isRejection(err) && p.annotated != nil && o.annRefused == nil {
		// Refused at commit (a clash, or the data plane), not by Put.
		annRefused = err
		st, err = commit(true)
	}
	if err != nil && isRejection(err) {
		st, o, err = c.syncFarmByFarm(ctx, p, owned)
	}
	if err != nil {
		return err
	}
	if o.annRefused == nil {
		o.annRefused = annRefused
	}
	c.flushStale(ctx, key, base, st, owned)
	c.hc.update(key, p.svc, p.eps, c.cfg.NodeName)
	if p.svc == nil {
		delete(c.owned, key)
		delete(c.lastErr, key)
	} else {
		c.owned[key] = o.names
		c.report(p, o)
	}
	c.finish(key, start, queued, st)
	return nil
}

// syncFarmByFarm is the last step for a Service whose default farms are
// refused when committed together (a clash with another Service, or a data
// plane refusing one at apply time): one transaction per farm, so the
// accepted ones serve and the refused ones are deleted.
func (c *Controller) syncFarmByFarm(ctx context.Context, p *servicePlan, owned []string) (*engine.State, outcome, error) {
	var o outcome
	keep := farmNames(p.defaults)
	if p.err != nil {
		keep = nil
		o.farmRefused = append(o.farmRefused, p.err)
	}
	st, err := c.cfg.Engine.Change(ctx, func(tx *engine.Txn) error {
		refused, err := p.prepareRanges(tx)
		if err != nil {
			return err
		}
		if refused != nil {
			p.rangesRefused = refused
			keep = farmNames(p.defaults)
		}
		return deleteOthers(tx, owned, keep)
	})
	if err != nil {
		return st, o, err
	}
	if p.rangesRefused != nil {
		o.farmRefused = append(o.farmRefused, p.rangesRefused)
	}
	for i := range keep {
		f := p.defaults[i]
		st, err = c.cfg.Engine.Change(ctx, func(tx *engine.Txn) error { return tx.Put(f) })
		if err == nil {
			o.names = append(o.names, f.Name)
			continue
		}
		if !isRejection(err) {
			return st, o, err
		}
		o.farmRefused = append(o.farmRefused, errFarm(f.Name, err))
		st, err = c.cfg.Engine.Change(ctx, func(tx *engine.Txn) error { return deleteOthers(tx, []string{f.Name}, nil) })
		if err != nil {
			return st, o, err
		}
	}
	st, err = c.cfg.Engine.Change(ctx, func(tx *engine.Txn) error { return dropSourceRanges(tx, p.key, p.ranges) })
	return st, o, err
}

// flushStale deletes the UDP conntrack entries of backends that the
// Service's farms had in base and no longer have in next.
func (c *Controller) flushStale(ctx context.Context, key string, base, next *engine.State, farmNames []string) {
	if c.cfg.Flows == nil || next == nil {
		return
	}
	var stale []dataplane.StaleFlow
	for _, n := range farmNames {
		old, ok := base.Farm(n)
		if !ok || old.Protocol != model.ProtoUDP || len(old.VirtualPorts) != 1 {
			continue
		}
		cur, _ := next.Farm(n)
		for _, b := range old.Backends {
			if cur != nil && slices.ContainsFunc(cur.Backends, func(x model.Backend) bool { return x.Addr == b.Addr && x.Port == b.Port }) {
				continue
			}
			stale = append(stale, dataplane.StaleFlow{VIP: old.VirtualAddr, Port: old.VirtualPorts[0].First, Backend: b.Addr})
		}
	}
	if len(stale) == 0 {
		return
	}
	n, err := c.cfg.Flows.DeleteUDPFlows(ctx, stale)
	if err != nil {
		c.log.Warn("flush stale udp conntrack entries", "service", key, "err", err)
		return
	}
	c.log.Debug("stale udp conntrack entries deleted", "service", key, "entries", n, "endpoints", len(stale))
}

func (c *Controller) finish(key string, start, queued time.Time, st *engine.State) {
	now := time.Now()
	c.stateMu.Lock()
	c.lastSync = now
	c.stateMu.Unlock()
	c.cfg.Metrics.synced(now.Sub(start), now.Sub(queued), now, c.queue.Len())
	if st == nil {
		st = c.cfg.Engine.Snapshot()
	}
	if c.cfg.Metrics != nil {
		c.cfg.Metrics.farms.Set(float64(st.Len()))
	}
	if c.onSynced != nil {
		c.onSynced(key, st)
	}
}

// report tells what a Service did not get as asked: a log line, and a
// Warning Event on the Service unless the same was already reported; once
// it gets everything again, a Normal Event says so.
func (c *Controller) report(p *servicePlan, o outcome) {
	reason, msg := p.problems(o)
	prev, had := c.lastErr[p.key]
	if msg == "" {
		if had {
			delete(c.lastErr, p.key)
			c.log.Info("service programmed as asked again", "service", p.key)
			c.recorder.Event(p.svc, corev1.EventTypeNormal, ReasonSynced, "xlb programs this Service as asked again")
		}
		return
	}
	c.cfg.Metrics.rejected()
	if had && prev == msg {
		return
	}
	c.lastErr[p.key] = msg
	c.log.Warn("service not programmed as asked", "service", p.key, "reason", reason, "err", msg)
	if len(msg) > maxEventMessage {
		msg = msg[:maxEventMessage-3] + "..."
	}
	c.recorder.Event(p.svc, corev1.EventTypeWarning, reason, msg)
}

// maxEventMessage keeps Event messages within the API server's limit.
const maxEventMessage = 1000

// fullSync replaces the engine's whole state with the farms of every
// Service, in one transaction, each Service stepping down as in
// syncService when its farms are refused. If the transaction as a whole
// fails (two Services claiming the same address and port, the data plane
// refusing a farm when applying it, or the kernel failing), it falls back
// to one transaction per Service, so one bad Service cannot hold the others
// back.
func (c *Controller) fullSync(ctx context.Context) error {
	start := time.Now()
	svcs, err := c.services.List(labels.Everything())
	if err != nil {
		return err
	}
	plans := make([]*servicePlan, 0, len(svcs))
	for _, svc := range svcs {
		p, err := c.plan(svc.Namespace + "/" + svc.Name)
		if err != nil {
			return err
		}
		plans = append(plans, p)
	}
	outcomes := make([]outcome, len(plans))
	st, err := c.cfg.Engine.Change(ctx, func(tx *engine.Txn) error {
		tx.ReplaceAll()
		for i, p := range plans {
			var err error
			if outcomes[i], err = p.put(tx, false); err != nil {
				return fmt.Errorf("service %s: %w", p.key, err)
			}
		}
		return nil
	})
	if err != nil {
		c.log.Warn("full reconcile in one transaction failed; syncing services one by one", "err", err)
		keys := make([]string, len(plans))
		for i, p := range plans {
			keys[i] = p.key
		}
		return c.fullSyncOneByOne(ctx, keys)
	}
	for i, p := range plans {
		c.owned[p.key] = outcomes[i].names
		c.report(p, outcomes[i])
		c.hc.update(p.key, p.svc, p.eps, c.cfg.NodeName)
	}
	c.finishFull(start, st, len(plans))
	return nil
}

// fullSyncOneByOne syncs each Service in its own transaction, then deletes
// farms that belong to no Service.
func (c *Controller) fullSyncOneByOne(ctx context.Context, keys []string) error {
	start := time.Now()
	for _, key := range keys {
		if err := c.syncService(ctx, key); err != nil {
			return err
		}
	}
	keep := map[string]bool{}
	for _, names := range c.owned {
		for _, n := range names {
			keep[n] = true
		}
	}
	st, err := c.cfg.Engine.Change(ctx, func(tx *engine.Txn) error {
		for _, f := range c.cfg.Engine.Snapshot().Farms() {
			if !keep[f.Name] {
				if err := tx.Delete(f.Name); err != nil {
					return err
				}
			}
		}
		return dropStaleSourceRanges(tx, c.cfg.Engine.Snapshot().Tables(), keys)
	})
	if err != nil {
		return err
	}
	c.finishFull(start, st, len(keys))
	return nil
}

func (c *Controller) finishFull(start time.Time, st *engine.State, services int) {
	now := time.Now()
	c.needFull = false
	c.stateMu.Lock()
	c.ready = true
	c.lastSync = now
	c.stateMu.Unlock()
	c.cfg.Metrics.fullSynced(now.Sub(start), now)
	if c.cfg.Metrics != nil {
		c.cfg.Metrics.farms.Set(float64(st.Len()))
	}
	c.log.Info("full reconcile done", "services", services, "farms", st.Len(), "took", now.Sub(start).Round(time.Microsecond))
	if c.onSynced != nil {
		c.onSynced("", st)
	}
}
