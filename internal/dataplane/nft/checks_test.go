package nft

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// The health checks' connections (sockets marked with
// dataplane.CheckSocketMark) get no conntrack entry in the LB's namespace;
// other connections from it do.
func TestChecksUntracked(t *testing.T) {
	e := newEnv(t, 1, false)
	f := e.farm("web", testutil.VIP4(1), 80, model.ProtoTCP, 8080)
	if err := e.p.Reconcile(context.Background(), []*model.Farm{mustValid(t, e.p, &f)}); err != nil {
		t.Fatal(err)
	}
	be := netip.AddrPortFrom(e.Backends[0].IPv4, 8080)
	testutil.StartTCPServer(t, e.Backends[0].NS, be, "be0")
	dial := func(mark bool) uint16 {
		t.Helper()
		var port uint16
		err := testutil.Do(e.LB.NS, func() error {
			d := net.Dialer{Timeout: 2 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
				var serr error
				c.Control(func(fd uintptr) {
					if mark {
						serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, dataplane.CheckSocketMark)
					}
				})
				return serr
			}}
			c, err := d.Dial("tcp", be.String())
			if err != nil {
				return err
			}
			defer c.Close()
			port = uint16(c.LocalAddr().(*net.TCPAddr).Port)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return port
	}
	tracked := func(port uint16) bool {
		out, _ := testutil.RunErr(e.LB.Name, "conntrack", "-L", "-p", "tcp", "--sport", fmt.Sprint(port))
		return strings.Contains(out, fmt.Sprintf("sport=%d ", port))
	}
	if p := dial(false); !tracked(p) {
		t.Fatalf("an unmarked connection from port %d is not tracked: the test cannot tell", p)
	}
	if p := dial(true); tracked(p) {
		t.Errorf("a check's connection from port %d is tracked", p)
	}
}
