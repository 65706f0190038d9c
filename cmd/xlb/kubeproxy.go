package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"
)

// kubeProxyBinary is the program behind `xlb kube-proxy`. It is separate
// because linking client-go costs every process milliseconds of package
// initialisation (measured: ~12 ms of `xlb --help` before the split), which
// `xlb dump` and `xlb list` must not pay.
const kubeProxyBinary = "xlb-kube-proxy"

// kubeProxyCmd runs xlb-kube-proxy (next to this binary, else on PATH) in
// place of this process, with the same arguments, so signals and the
// process id stay the same.
func (a *app) kubeProxyCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "kube-proxy [flags]",
		Short: "Run as the Kubernetes service proxy (replaces kube-proxy)",
		Long: `Run as the Kubernetes service proxy: watch Services, EndpointSlices and this
node through the Kubernetes API and program them as xlb farms.

This runs the ` + kubeProxyBinary + ` program installed next to xlb (or on PATH)
with the same arguments; see "xlb kube-proxy --help" for its flags.`,
		Example: `  xlb kube-proxy --kubeconfig /etc/kubernetes/proxy.conf --hostname-override node1
  xlb kube-proxy --hostname-override "$NODE_NAME" --nodeport-addresses 192.168.0.0/16`,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, argv []string) error {
			bin, err := findKubeProxy()
			if err != nil {
				return err
			}
			return syscall.Exec(bin, append([]string{bin}, argv...), os.Environ())
		},
	}
}

func findKubeProxy() (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), kubeProxyBinary)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath(kubeProxyBinary)
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return "", fmt.Errorf("kube-proxy: %s is not installed next to xlb or on PATH (make build puts it in bin/)", kubeProxyBinary)
		}
		return "", err
	}
	return p, nil
}
