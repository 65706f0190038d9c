package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/xlb-lb/xlb/internal/cluster/bgp"
	"github.com/xlb-lb/xlb/internal/engine"
)

// kubeCRDDaemon is xlb daemon built with client-go (go build -tags
// kubecrd ./cmd/xlb, `make build`): `xlb daemon --kube-crd` runs it in
// place of this process, as `xlb kube-proxy` runs xlb-kube-proxy, because
// client-go costs every process that links it milliseconds of package
// initialisation that `xlb dump` or `xlb list` should not pay.
const kubeCRDDaemon = "xlb-kube-daemon"

// kubeCRDOptions: the daemon takes its farms, tables and checks from
// Kubernetes custom resources (internal/kube/crd, docs/ha.md).
type kubeCRDOptions struct {
	enabled    bool
	kubeconfig string
	node       string
	wait       time.Duration
}

func (o *kubeCRDOptions) register(f *pflag.FlagSet) {
	f.BoolVar(&o.enabled, "kube-crd", false, "take the farms, tables and checks from the Farm, Table and Check custom resources (xlb.io/v1alpha1, deploy/crd/crds.yaml) of a Kubernetes cluster, and report in each one's status whether this node programmed it; the API is read-only then (docs/ha.md)")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "with --kube-crd: kubeconfig of the API server (default: the in-cluster service account)")
	f.StringVar(&o.node, "kube-node-name", "", "with --kube-crd: this node's name in the resources' status and Events (default: the host name)")
	f.DurationVar(&o.wait, "kube-crd-wait", 10*time.Second, "with --kube-crd and --bgp-config: longest wait for the first sync with the API server before the VIPs of the saved state are announced")
}

// kubeCRDStarter starts the custom resources' controller on the engine;
// it runs until ctx ends. It does not wait for the API server: a node that
// cannot reach it serves what it has (its saved state) meanwhile; the gate
// it returns holds BGP announcements back until the first sync (or
// --kube-crd-wait). nil in a build without client-go.
type kubeCRDStarter func(ctx context.Context, log *slog.Logger, eng *engine.Engine, o kubeCRDOptions) (bgp.Gate, error)

// execKubeCRDDaemon runs xlb-kube-daemon (next to this binary, else on
// PATH) in place of this process with the same arguments, so signals and
// the process id stay the same.
func execKubeCRDDaemon() error {
	var bin string
	if self, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(self), kubeCRDDaemon); fileExists(p) {
			bin = p
		}
	}
	if bin == "" {
		p, err := exec.LookPath(kubeCRDDaemon)
		if err != nil {
			if errors.Is(err, exec.ErrNotFound) {
				return fmt.Errorf("--kube-crd: %s is not installed next to xlb or on PATH (make build puts it in bin/)", kubeCRDDaemon)
			}
			return err
		}
		bin = p
	}
	return syscall.Exec(bin, append([]string{bin}, os.Args[1:]...), os.Environ())
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
