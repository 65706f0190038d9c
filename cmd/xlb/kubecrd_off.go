//go:build !kubecrd

package main

// kubeCRD is nil in this build: --kube-crd runs xlb-kube-daemon.
func kubeCRD() kubeCRDStarter { return nil }
