package nft

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// RemoveTables deletes xlb's tables of a prefix, of any layout, and the
// named tables' and the counter table, and nothing else: not another prefix's (the
// kube-proxy's), not another program's.
func TestRemoveTables(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	name, ns := testutil.NewNetNS(t)
	nft := func(args ...string) string { return testutil.Run(t, name, append([]string{"nft"}, args...)...) }
	for _, tb := range []string{"inet xlb", "inet xlb-00", "netdev xlb-00", "inet xlb-1f", "inet xlb-tables", "inet xlb-counters",
		"inet xlb-kube", "inet xlb-kube-counters", "inet xlb-kube-00", "inet xlb-kube-tables", "inet xlb-kube-counters", "inet firewalld", "netdev xlb-other", "ip xlb"} {
		nft(append([]string{"add", "table"}, strings.Fields(tb)...)...)
	}
	gone, err := RemoveTables(context.Background(), ns, "xlb")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(gone)
	want := []string{"table inet xlb", "table inet xlb-00", "table inet xlb-1f", "table inet xlb-counters", "table inet xlb-tables", "table netdev xlb-00"}
	if !slices.Equal(gone, want) {
		t.Errorf("removed %v, want %v", gone, want)
	}
	left := nft("list", "tables")
	for _, keep := range []string{"inet xlb-kube\n", "inet xlb-kube-00", "inet xlb-kube-tables", "inet firewalld", "netdev xlb-other", "ip xlb"} {
		if !strings.Contains(left, keep) {
			t.Errorf("%s removed:\n%s", keep, left)
		}
	}
	if gone, err := RemoveTables(context.Background(), ns, "xlb"); err != nil || len(gone) != 0 {
		t.Errorf("second run: %v %v", gone, err)
	}
}
