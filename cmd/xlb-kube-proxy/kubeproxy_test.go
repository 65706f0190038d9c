package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestDataplaneFlags: each data plane's flags are refused with the other
// plane, and values out of range are refused before anything is opened
// (the same flags and checks as xlb daemon's: internal/setup).
func TestDataplaneFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--dataplane", "xdp"}, `--dataplane "xdp": allowed values are nft, ebpf`},
		{[]string{"--interfaces", "eth0"}, `--interfaces: only with --dataplane ebpf`},
		{[]string{"--dataplane", "nft", "--xdp", "generic"}, `--xdp: only with --dataplane ebpf`},
		{[]string{"--nft-tables", "0"}, `--nft-tables 0: allowed values are 1 to`},
		{[]string{"--dataplane", "ebpf", "--nft-tables", "4"}, `--nft-tables: only with --dataplane nft`},
		{[]string{"--dataplane", "ebpf", "--conn-table-size", "0"}, `--conn-table-size 0: allowed values are 1 to`},
		{[]string{"--dataplane", "ebpf", "--pin-path", ""}, `--pin-path: must be a directory on a bpf file system`},
		{[]string{"--dataplane", "ebpf", "--xdp", "fast"}, `--xdp "fast": allowed values are off, generic, native`},
		{[]string{"--dataplane", "ebpf", "--ct-timeout-udp", "-1s"}, `--ct-timeout-udp -1s: allowed values are`},
		{[]string{"--dataplane", "nft", "--ct-timeout-tcp", "1h"}, `--ct-timeout-tcp: only with --dataplane ebpf`},
		{[]string{"--dataplane", "nft", "--conn-table-size", "0"}, `--conn-table-size 0: allowed values are 1 to`},
	} {
		var out bytes.Buffer
		a := &app{errOut: &out, getenv: func(string) string { return "" }}
		cmd := a.kubeProxyCmd()
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(c.args)
		err := cmd.ExecuteContext(context.Background())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.args, err, c.want)
		}
	}
}
