//go:build kubecrd

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/xlb-lb/xlb/internal/cluster/bgp"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/kube/crd"
)

// kubeCRD is the custom resources' controller (this is xlb-kube-daemon).
func kubeCRD() kubeCRDStarter { return startKubeCRD }

func startKubeCRD(ctx context.Context, log *slog.Logger, eng *engine.Engine, o kubeCRDOptions) (bgp.Gate, error) {
	var cfg *rest.Config
	var err error
	if o.kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("--kube-crd: Kubernetes client configuration: %w", err)
	}
	cfg.UserAgent = "xlb-daemon"
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("--kube-crd: %w", err)
	}
	node := o.node
	if node == "" {
		if node, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("--kube-crd: no --kube-node-name and no host name: %w", err)
		}
	}
	c, err := crd.New(crd.Config{Log: log.With("component", "kube-crd"), Client: dyn, Engine: eng, Node: node, Wait: o.wait})
	if err != nil {
		return nil, err
	}
	go func() {
		if err := c.Run(ctx); err != nil && ctx.Err() == nil {
			log.Error("custom resources' controller stopped", "err", err)
		}
	}()
	return c, nil
}
