package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/ebpf"
	"github.com/xlb-lb/xlb/internal/dataplane/nft"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/kube"
	"github.com/xlb-lb/xlb/internal/store"
)

// nftTablePrefix names the nft plane's tables (xlb-kubebench-00, ...).
const nftTablePrefix = "xlb-kubebench"

// xlbProxy is xlb's controller as xlb kube-proxy runs it, in this process,
// on data plane "nft" (farms over -nft-tables tables) or "ebpf" (attached
// to the topology's interfaces, pinned in a bpffs of its own), with its
// state in a fresh directory: each start is a first start.
type xlbProxy struct {
	plane  string
	eng    *engine.Engine
	ctl    *kube.Controller
	reg    *prometheus.Registry
	synced chan syncEvent
	full   time.Duration // informer sync + full reconcile
	stop   func()
}

func startXLB(ctx context.Context, c kubernetes.Interface, plane, dir string) (*xlbProxy, error) {
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var undo []func()
	cleanup := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	var dp dataplane.Dataplane
	var err error
	switch plane {
	case "nft":
		dp, err = nft.New(ctx, quiet, nft.Options{Table: nftTablePrefix, Shards: *tables})
		if err == nil {
			undo = append(undo, func() { dp.Close(); deleteNftTables(nftTablePrefix) })
		}
	case "ebpf":
		pin, unmount, merr := mountBPFFS()
		if merr != nil {
			return nil, merr
		}
		undo = append(undo, unmount)
		var p *ebpf.Plane
		p, err = ebpf.New(ctx, quiet, ebpf.Options{Interfaces: topoIfaces, PinPath: pin, ConnTableSize: 2 * 131072})
		if err == nil {
			dp = p
			undo = append(undo, func() { _ = p.Destroy() })
		}
	default:
		err = fmt.Errorf("data plane %q", plane)
	}
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("open %s plane: %w", plane, err)
	}
	sdir, err := os.MkdirTemp(dir, "state-")
	if err != nil {
		cleanup()
		return nil, err
	}
	undo = append(undo, func() { os.RemoveAll(sdir) })
	bolt, err := store.OpenBolt(sdir)
	if err != nil {
		cleanup()
		return nil, err
	}
	st := store.NewWriteBehind(bolt, quiet) // as xlb kube-proxy does
	undo = append(undo, func() { st.Close() })
	eng, err := engine.New(ctx, quiet, dp, st)
	if err != nil {
		cleanup()
		return nil, err
	}
	x := &xlbProxy{plane: plane, eng: eng, reg: prometheus.NewRegistry(), synced: make(chan syncEvent, 1<<16)}
	x.ctl, err = kube.New(kube.Config{Client: c, Engine: eng, Log: quiet, NodeName: "bench-node", Metrics: kube.NewMetrics(x.reg)})
	if err != nil {
		cleanup()
		return nil, err
	}
	x.ctl.OnSynced(func(key string, st *engine.State) {
		select {
		case x.synced <- syncEvent{key: key, at: time.Now(), st: st}:
		default:
		}
	})
	cctx, ccancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	t0 := time.Now()
	go func() { done <- x.ctl.Run(cctx) }()
	x.stop = func() {
		ccancel()
		<-done
		cleanup()
	}
	if err := waitFull(ctx, x.synced); err != nil {
		x.stop()
		return nil, err
	}
	x.full = time.Since(t0)
	// Drain the per-Service syncs the informers' initial adds queued.
	if err := drain(ctx, x.synced, 3*time.Second); err != nil {
		x.stop()
		return nil, err
	}
	return x, nil
}

// deleteNftTables deletes the inet tables whose name starts with prefix
// (in the benchmark's own namespace), so the next proxy starts clean.
func deleteNftTables(prefix string) {
	out, err := exec.Command("nft", "list", "tables").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "table" && strings.HasPrefix(f[2], prefix) {
			_ = exec.Command("nft", "delete", "table", f[1], f[2]).Run()
		}
	}
}

// flushRuleset empties the benchmark namespace's nftables (and so the
// iptables-nft rules kube-proxy's iptables mode leaves behind).
func flushRuleset() {
	_ = exec.Command("nft", "flush", "ruleset").Run()
}
