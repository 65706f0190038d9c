package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/setup"
)

// syncBuffer is a bytes.Buffer safe for the daemon's log writes and the
// test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runningDaemon is `xlb daemon` run in process on a data plane the test
// gives.
type runningDaemon struct {
	addr string
	logs *syncBuffer
	stop func() int // stops the daemon, returns its exit code
}

// startDaemonWith runs `xlb daemon args...` with the data plane open
// returns (nil: a new fake plane) and env as its environment. It returns
// once the API serves, or with the exit code and logs if the daemon
// stopped first (daemon nil).
func startDaemonWith(t *testing.T, open func() (dataplane.Dataplane, error), env map[string]string, args ...string) (d *runningDaemon, code int, logs string) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	ready := make(chan net.Addr, 1)
	buf := &syncBuffer{}
	if open == nil {
		open = func() (dataplane.Dataplane, error) { return fake.New(), nil }
	}
	a := &app{in: strings.NewReader(""), out: io.Discard, errOut: buf, getenv: func(k string) string { return env[k] },
		openDataplane: func(context.Context, *slog.Logger, setup.Flags) (dataplane.Dataplane, error) { return open() },
		daemonReady:   func(a net.Addr) { ready <- a }}
	done := make(chan int, 1)
	go func() { done <- a.run(ctx, append([]string{"daemon", "--listen", "127.0.0.1:0"}, args...)) }()
	select {
	case addr := <-ready:
		stopped := false
		d := &runningDaemon{addr: addr.String(), logs: buf, stop: func() int {
			if stopped {
				return 0
			}
			stopped = true
			cancel()
			return <-done
		}}
		t.Cleanup(func() { d.stop() })
		return d, 0, ""
	case code := <-done:
		cancel()
		return nil, code, buf.String()
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("daemon did not start")
	}
	return nil, 0, ""
}

// samePlane opens p every time: one fake kernel across daemon restarts.
func samePlane(p dataplane.Dataplane) func() (dataplane.Dataplane, error) {
	return func() (dataplane.Dataplane, error) { return p, nil }
}
