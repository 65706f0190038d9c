package health

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/model"
)

// BenchmarkProbeTCP is one tcp check against a loopback listener that
// accepts and closes: what a check costs the checker (and, on loopback,
// the kernel's work for both ends).
func BenchmarkProbeTCP(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	dst := netip.MustParseAddrPort(ln.Addr().String())
	f := &model.Farm{Name: "f", Backends: []model.Backend{{Name: "b", Addr: dst.Addr(), Port: dst.Port()}}}
	p, err := compile(f, 0, model.Check{Type: model.CheckTCP, Port: dst.Port(), Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	d := &dialer{}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if r := p.run(ctx, d); !r.OK {
			b.Fatal(r.Detail)
		}
	}
}
