package ebpf

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// connLogSink is a slog.Handler that passes every record to next and keeps
// the plane's "new connection" records for a test to wait for.
type connLogSink struct {
	next slog.Handler
	ch   chan slog.Record
}

func newConnLogSink(next slog.Handler) *connLogSink {
	return &connLogSink{next: next, ch: make(chan slog.Record, 4096)}
}

func (s *connLogSink) Enabled(ctx context.Context, l slog.Level) bool { return true }
func (s *connLogSink) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "new connection" || r.Message == "policy drop" {
		select {
		case s.ch <- r.Clone():
		default:
		}
	}
	return s.next.Handle(ctx, r)
}
func (s *connLogSink) WithAttrs(as []slog.Attr) slog.Handler { return s }
func (s *connLogSink) WithGroup(string) slog.Handler         { return s }

// connLogEntry is a record's attributes by key, and as "key=value ..." text.
func connLogEntry(r slog.Record) (map[string]string, string) {
	m := map[string]string{}
	var b strings.Builder
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		fmt.Fprintf(&b, "%s=%s ", a.Key, a.Value.String())
		return true
	})
	return m, b.String()
}

// wait returns the next record whose text contains substr.
func (s *connLogSink) wait(substr string, timeout time.Duration) (map[string]string, error) {
	deadline := time.After(timeout)
	for {
		select {
		case r := <-s.ch:
			if m, text := connLogEntry(r); strings.Contains(text, substr) {
				return m, nil
			}
		case <-deadline:
			return nil, fmt.Errorf("no connection log record with %q within %v", substr, timeout)
		}
	}
}

// nflogEntry turns a record into what the conformance suite's log scenario
// checks (it was written for NFLOG).
func nflogEntry(m map[string]string) (testutil.NFLogEntry, error) {
	src, err := netip.ParseAddrPort(m["client"])
	if err != nil {
		return testutil.NFLogEntry{}, fmt.Errorf("client %q: %w", m["client"], err)
	}
	da := m["backend_addr"]
	if da == "" {
		da = m["vip"] // a policy drop
	}
	dst, err := netip.ParseAddrPort(da)
	if err != nil {
		return testutil.NFLogEntry{}, fmt.Errorf("backend_addr %q: %w", m["backend_addr"], err)
	}
	return testutil.NFLogEntry{Prefix: m["prefix"], Src: src.Addr(), Dst: dst.Addr()}, nil
}

// connLogs: the sink of the plane opened on each namespace path
// (conformance scenarios run in parallel).
var connLogs = struct {
	sync.Mutex
	m map[string]*connLogSink
}{m: map[string]*connLogSink{}}

func registerConnLog(tb testing.TB, path string, s *connLogSink) {
	connLogs.Lock()
	connLogs.m[path] = s
	connLogs.Unlock()
	tb.Cleanup(func() {
		connLogs.Lock()
		delete(connLogs.m, path)
		connLogs.Unlock()
	})
}

func connLogOf(tb testing.TB, path string) func(string, time.Duration) (testutil.NFLogEntry, error) {
	connLogs.Lock()
	s := connLogs.m[path]
	connLogs.Unlock()
	if s == nil {
		tb.Fatalf("no ebpf plane opened on %s", path)
	}
	return func(substr string, timeout time.Duration) (testutil.NFLogEntry, error) {
		m, err := s.wait(substr, timeout)
		if err != nil {
			return testutil.NFLogEntry{}, err
		}
		return nflogEntry(m)
	}
}
