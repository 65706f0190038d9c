package e2e

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestNftConnTableSizeOutsideHostNS: `xlb daemon --dataplane nft
// --conn-table-size N` in a network namespace other than the host's cannot
// set the kernel's conntrack limits (they are global and read-only there),
// so it refuses to start with an error naming the sysctl, and leaves them
// as they were. The daemon runs in a namespace of the test's own, never
// the host's.
func TestNftConnTableSizeOutsideHostNS(t *testing.T) {
	testutil.RequireRoot(t)
	bin := xlbBinary(t)
	name, _ := testutil.NewNetNS(t)
	read := func() string {
		out, err := exec.Command("ip", "netns", "exec", name, "cat", "/proc/sys/net/netfilter/nf_conntrack_max").CombinedOutput()
		if err != nil {
			// nf_conntrack not loaded yet: the daemon's NAT chains load it.
			return ""
		}
		return strings.TrimSpace(string(out))
	}
	before := read()
	want := 1 << 20
	if before == strconv.Itoa(want) {
		want++
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", name, bin, "daemon", "--listen", "127.0.0.1:0",
		"--state-dir", t.TempDir(), "--dataplane", "nft", "--conn-table-size", strconv.Itoa(want))
	cmd.Env = append(os.Environ(), "XLB_KEY="+testKey)
	out, err := cmd.CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("daemon started (err %v, ctx %v):\n%s", err, ctx.Err(), out)
	}
	for _, w := range []string{"net.netfilter.nf_conntrack_max", strconv.Itoa(want), "read-only in this network namespace"} {
		if !strings.Contains(string(out), w) {
			t.Errorf("daemon output does not mention %q:\n%s", w, out)
		}
	}
	t.Logf("refused as expected:\n%s", out)
	if after := read(); before != "" && after != before {
		t.Errorf("nf_conntrack_max %s -> %s", before, after)
	}
}
