package setup

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestCheck: each plane's flags are refused with the other plane, values
// out of range name the flag, the value and what is allowed, and the
// defaults of both binaries pass.
func TestCheck(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // "" = accepted
	}{
		{nil, ""},
		{[]string{"--dataplane", "ebpf"}, ""},
		{[]string{"--dataplane", "nft", "--conn-table-size", "1000"}, ""},
		{[]string{"--dataplane", "xdp"}, `--dataplane "xdp": allowed values are nft, ebpf`},
		{[]string{"--interfaces", "eth0"}, "--interfaces: only with --dataplane ebpf"},
		{[]string{"--ct-timeout-udp", "10s"}, "--ct-timeout-udp: only with --dataplane ebpf"},
		{[]string{"--dataplane", "ebpf", "--nft-tables", "2"}, "--nft-tables: only with --dataplane nft"},
		{[]string{"--nft-tables", "257"}, "--nft-tables 257: allowed values are 1 to 256"},
		{[]string{"--nft-table", ""}, `--nft-table "": must name a table`},
		{[]string{"--conn-table-size", "0"}, "--conn-table-size 0: allowed values are 1 to"},
		{[]string{"--dataplane", "ebpf", "--xdp", "fast"}, `--xdp "fast": allowed values are off, generic, native`},
		{[]string{"--dataplane", "ebpf", "--ct-timeout-tcp", "0s"}, "--ct-timeout-tcp 0s: allowed values are 1s to 720h"},
		{[]string{"--dataplane", "ebpf", "--pin-path", ""}, "--pin-path: must be a directory on a bpf file system"},
		{[]string{"--dataplane", "ebpf", "--interfaces", "eth0,veth*,lxc[0-9]"}, ""},
		{[]string{"--dataplane", "ebpf", "--interfaces", "eth0,veth["}, `"veth[" is not a valid pattern`},
		{[]string{"--socket-lb-cgroup", "/sys/fs/cgroup"}, "--socket-lb-cgroup: only with --dataplane ebpf"},
		{[]string{"--dataplane", "ebpf", "--socket-lb-cgroup", "/proc"}, `--socket-lb-cgroup "/proc": not a cgroup v2 directory`},
		{[]string{"--dataplane", "ebpf", "--socket-lb-cgroup", "/nonexistent"}, `--socket-lb-cgroup "/nonexistent": no such file`},
		{[]string{"--snat-ports", "20000-29999"}, ""},
		{[]string{"--dataplane", "ebpf", "--snat-ports", "1024-1024"}, ""},
		{[]string{"--snat-ports", "80-1000"}, `--snat-ports "80-1000": must be FIRST-LAST with 1024 <= FIRST <= LAST <= 65535`},
		{[]string{"--snat-ports", "3000-2000"}, `--snat-ports "3000-2000": must be FIRST-LAST`},
		{[]string{"--snat-ports", "2000"}, `--snat-ports "2000": must be FIRST-LAST`},
		{[]string{"--snat-ports", "2000-70000"}, `--snat-ports "2000-70000": must be FIRST-LAST`},
	} {
		for _, d := range []Defaults{DaemonDefaults, {NFTTable: "xlb-kube", PinPath: "/sys/fs/bpf/xlb-kube"}} {
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			var f Flags
			f.Register(fs, d)
			if err := fs.Parse(c.args); err != nil {
				t.Fatalf("%v: parse: %v", c.args, err)
			}
			err := f.Check()
			switch {
			case c.want == "" && err != nil:
				t.Errorf("%v: %v, want it accepted", c.args, err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Errorf("%v: error %v, want %q", c.args, err, c.want)
			}
		}
	}
}
