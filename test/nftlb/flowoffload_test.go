package nftlb

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestFlowOffloadKernel keeps docs/nftlb-compat.md's word on flow-offload
// true: xlb refuses "flow-offload": "on" because the kernel it is built
// and tested on has no flowtables (CONFIG_NF_FLOW_TABLE not set), so
// nothing could be shown with traffic; nftlb 1.0.7 answers success for the
// same farm and programs nothing for it. On a kernel with flowtables this
// test fails: flow-offload can then be built and tested.
func TestFlowOffloadKernel(t *testing.T) {
	nftlb, xlb := startPeers(t)
	testutil.Run(t, nftlb.nsName, "ip", "link", "add", "d0", "type", "veth", "peer", "name", "d0p")
	testutil.Run(t, nftlb.nsName, "ip", "addr", "add", "10.0.0.1/24", "dev", "d0")
	testutil.Run(t, nftlb.nsName, "ip", "link", "set", "d0", "up")
	probe := exec.Command("ip", "netns", "exec", nftlb.nsName, "nft", "-f", "-")
	probe.Stdin = strings.NewReader("table ip ftprobe {\n flowtable ft { hook ingress priority 50; devices = { d0 }; }\n}\n")
	out, err := probe.CombinedOutput()
	if err == nil {
		t.Fatalf("this kernel has flowtables: flow-offload can be built now (docs/nftlb-compat.md says it cannot)")
	}
	if !strings.Contains(string(out), "No such file or directory") {
		t.Errorf("flowtable probe failed otherwise than for a kernel without flowtables: %v: %s", err, out)
	}
	farm := `{"farms":[{"name":"fo","virtual-addr":"10.0.0.1","virtual-ports":"80","mode":"snat","flow-offload":"on",
		"backends":[{"name":"b1","ip-addr":"10.0.0.2","port":"80","state":"up"}]}]}`
	if r := nftlb.do(t, "POST", "/farms", farm); r.status != 200 {
		t.Errorf("nftlb: %d %s, want 200 (it answers success)", r.status, r.body)
	}
	if rules := testutil.Run(t, nftlb.nsName, "nft", "list", "ruleset"); strings.Contains(rules, "10.0.0.1") {
		t.Errorf("nftlb programmed the farm on a kernel without flowtables:\n%s", rules)
	}
	r := xlb.do(t, "POST", "/farms", farm)
	if text, _ := responseText(r.body); r.status != 400 || !strings.Contains(text, `"flow-offload" value "on"`) {
		t.Errorf("xlb: %d %s, want 400 naming flow-offload", r.status, r.body)
	}
}
