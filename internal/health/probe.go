package health

import (
	"bufio"
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/xlb-lb/xlb/internal/model"
)

// Result is the outcome of one check.
type Result struct {
	OK     bool
	Detail string // why: "connect refused", "HTTP 503", "timeout after 1s", "HTTP 200", ...
	Start  time.Time
	Took   time.Duration
	// Agent and exec checks also set weights: Percent (agent "NN%", 0 for
	// "drain"; -1: not said) and Weight (exec "weight N"; -1: not said).
	Percent int32
	Weight  int32
	// Now: the answer takes the backend down at once, without waiting
	// for fall failures (an agent's "down" or "maint").
	Now bool
}

// probe is a compiled check of one backend.
type probe struct {
	check   model.Check
	dst     netip.AddrPort
	send    []byte
	expect  []byte
	regex   *regexp.Regexp
	digest  []byte // md5 or sha256, by length
	request []byte // http: the whole request
	env     []string
	// https: the TLS configuration; tlsErr, why there is none (a CA
	// file that cannot be read fails every check with it).
	tls    *tls.Config
	tlsErr error
}

// maxBody bounds what an HTTP check reads of a body it must match.
const maxBody = 1 << 20

func compile(f *model.Farm, i int, c model.Check) (*probe, error) {
	b := &f.Backends[i]
	p := &probe{check: c, dst: netip.AddrPortFrom(b.Addr, c.Port)}
	var err error
	if p.send, err = model.DecodePayload(c.Send); err != nil {
		return nil, err
	}
	if p.expect, err = model.DecodePayload(c.Expect); err != nil {
		return nil, err
	}
	if c.BodyRegex != "" {
		if p.regex, err = regexp.Compile(c.BodyRegex); err != nil {
			return nil, err
		}
	}
	if c.BodyDigest != "" {
		if p.digest, err = hex.DecodeString(c.BodyDigest); err != nil {
			return nil, err
		}
	}
	if c.Type == model.CheckHTTP || c.Type == model.CheckHTTPS {
		host := c.Host
		if host == "" {
			host = p.dst.String()
		}
		p.request = fmt.Appendf(nil, "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: xlb-health-check\r\nAccept: */*\r\nConnection: close\r\n\r\n",
			c.Method, c.Path, host)
	}
	if c.Type == model.CheckHTTPS {
		p.tls, p.tlsErr = tlsConfig(c, p.dst.Addr())
	}
	if c.Type == model.CheckExec {
		port := ""
		if c.Port != 0 {
			port = strconv.Itoa(int(c.Port))
		}
		p.env = append(os.Environ(), "XLB_FARM="+f.Name, "XLB_BACKEND="+b.Name,
			"XLB_BACKEND_ADDR="+b.Addr.String(), "XLB_BACKEND_PORT="+port)
	}
	return p, nil
}

// tlsConfig is an https check's TLS configuration. Without verify, like
// HAProxy's "check-ssl verify none" and keepalived's SSL_GET: the check is
// about the service answering, not its certificate. With verify, the
// certificate must chain to the CA file's certificates (or the system's
// roots) and name host, else the backend's address (HAProxy's "verify
// required ca-file ... verifyhost").
func tlsConfig(c model.Check, addr netip.Addr) (*tls.Config, error) {
	name := c.Host
	if name == "" {
		name = addr.String()
	}
	cfg := &tls.Config{ServerName: name, InsecureSkipVerify: !c.Verify}
	if !c.Verify || c.CAFile == "" {
		return cfg, nil
	}
	pem, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA file %s: no PEM certificate in it", c.CAFile)
	}
	cfg.RootCAs = pool
	return cfg, nil
}

// run performs the check once.
func (p *probe) run(ctx context.Context, d *dialer) Result {
	start := time.Now()
	deadline := start.Add(p.check.Timeout)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var r Result
	switch p.check.Type {
	case model.CheckTCP:
		r = p.tcp(ctx, d, deadline)
	case model.CheckHTTP, model.CheckHTTPS:
		r = p.http(ctx, d, deadline)
	case model.CheckUDP:
		r = p.udp(ctx, d, deadline)
	case model.CheckExec:
		r = p.exec(ctx, d)
	case model.CheckAgent:
		r = p.agent(ctx, d, deadline)
	default:
		r = Result{Detail: "unknown check type " + p.check.Type.String(), Percent: -1, Weight: -1}
	}
	r.Start, r.Took = start, time.Since(start)
	return r
}

func fail(detail string) Result { return Result{Detail: detail, Percent: -1, Weight: -1} }
func pass(detail string) Result { return Result{OK: true, Detail: detail, Percent: -1, Weight: -1} }

func (p *probe) failErr(err error) Result { return fail(describe(err, p.check.Timeout)) }

func (p *probe) tcp(ctx context.Context, d *dialer, deadline time.Time) Result {
	if p.check.HalfOpen && p.dst.Addr().Is4() {
		if r, ok := p.halfOpen(ctx, d); ok {
			return r
		}
	}
	c, err := d.dial(ctx, "tcp", p.check.SourceAddr, p.dst, deadline)
	if err != nil {
		return p.failErr(err)
	}
	defer c.Close()
	if len(p.send) == 0 && len(p.expect) == 0 {
		return pass("connected")
	}
	c.SetDeadline(deadline)
	if len(p.send) > 0 {
		if _, err := c.Write(p.send); err != nil {
			return p.failErr(err)
		}
	}
	if len(p.expect) == 0 {
		return pass("sent")
	}
	return p.readExpect(c)
}

// batchable reports whether the check is a half-open one the monitor
// sends in batches (synprobe.go): tcp, half-open, an IPv4 backend, nothing
// to send or expect.
func (p *probe) batchable() bool {
	return p.check.Type == model.CheckTCP && p.check.HalfOpen && p.dst.Addr().Is4() && len(p.send) == 0 && len(p.expect) == 0
}

// connectable reports whether the check can be a connect the monitor runs
// without a goroutine (connprobe.go): tcp, nothing to send or expect, no
// IPv6 zone. A half-open one is too when the half-open engine cannot take
// it (every source port busy towards its backend, or no raw socket): a
// burst of those under load spawned a goroutine each.
func (p *probe) connectable() bool {
	return p.check.Type == model.CheckTCP && len(p.send) == 0 && len(p.expect) == 0 && p.dst.Addr().Zone() == ""
}

// halfOpen runs a half-open check (synprobe.go); ok is false when it
// cannot (no raw socket, every source port busy): the caller connects.
func (p *probe) halfOpen(ctx context.Context, d *dialer) (Result, bool) {
	sp, err := d.prober()
	if err != nil {
		return Result{}, false
	}
	answer, err := sp.probe(ctx, d, p.check.SourceAddr, p.dst)
	switch {
	case err == nil && answer == synUp:
		return pass(answer), true
	case err == nil:
		return fail(answer), true
	case errors.Is(err, errSynBusy):
		return Result{}, false
	}
	return p.failErr(err), true
}

// readExpect reads until the expected bytes arrive, the peer closes or the
// deadline passes.
func (p *probe) readExpect(c net.Conn) Result {
	buf := make([]byte, 0, 512)
	for len(buf) < 64<<10 {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if bytes.Contains(buf, p.expect) {
			return pass("expected answer")
		}
		if err == io.EOF {
			return fail(fmt.Sprintf("answer without %q: %q", p.expect, shorten(buf)))
		}
		if err != nil {
			return p.failErr(err)
		}
	}
	return fail(fmt.Sprintf("answer without %q in its first 64 KiB", p.expect))
}

func (p *probe) http(ctx context.Context, d *dialer, deadline time.Time) Result {
	raw, err := d.dial(ctx, "tcp", p.check.SourceAddr, p.dst, deadline)
	if err != nil {
		return p.failErr(err)
	}
	defer raw.Close()
	raw.SetDeadline(deadline)
	var c net.Conn = raw
	if p.check.Type == model.CheckHTTPS {
		if p.tlsErr != nil {
			return fail("TLS: " + p.tlsErr.Error())
		}
		tc := tls.Client(raw, p.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			return fail("TLS handshake: " + describe(err, p.check.Timeout))
		}
		c = tc
	}
	if _, err := c.Write(p.request); err != nil {
		return p.failErr(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: p.check.Method})
	if err != nil {
		if err == io.ErrUnexpectedEOF || err == io.EOF {
			return fail("connection closed before an HTTP answer")
		}
		return p.failErr(err)
	}
	defer resp.Body.Close()
	status := "HTTP " + strconv.Itoa(resp.StatusCode)
	if !model.StatusOK(p.check.Status, resp.StatusCode) {
		return fail(status)
	}
	if p.regex == nil && p.digest == nil {
		return pass(status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fail(status + ", body: " + describe(err, p.check.Timeout))
	}
	if p.regex != nil && !p.regex.Match(body) {
		return fail(status + ", body does not match " + p.check.BodyRegex)
	}
	if p.digest != nil {
		var sum []byte
		if len(p.digest) == md5.Size {
			s := md5.Sum(body)
			sum = s[:]
		} else {
			s := sha256.Sum256(body)
			sum = s[:]
		}
		if !bytes.Equal(sum, p.digest) {
			return fail(status + ", body digest " + hex.EncodeToString(sum))
		}
	}
	return pass(status)
}

func (p *probe) udp(ctx context.Context, d *dialer, deadline time.Time) Result {
	c, err := d.dial(ctx, "udp", p.check.SourceAddr, p.dst, deadline)
	if err != nil {
		return p.failErr(err)
	}
	defer c.Close()
	c.SetDeadline(deadline)
	if _, err := c.Write(p.send); err != nil {
		return p.failErr(err)
	}
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	switch {
	case err != nil && errors.Is(err, syscall.ECONNREFUSED):
		return fail("port unreachable")
	case err != nil && isTimeout(err) && len(p.expect) == 0:
		// keepalived's UDP_CHECK without require_reply: no answer and
		// no ICMP error is up.
		return pass("no ICMP error")
	case err != nil && isTimeout(err):
		return fail("no answer (timeout after " + p.check.Timeout.String() + ")")
	case err != nil:
		return p.failErr(err)
	case len(p.expect) > 0 && !bytes.Contains(buf[:n], p.expect):
		return fail(fmt.Sprintf("answer without %q: %q", p.expect, shorten(buf[:n])))
	}
	return pass("answered")
}

// exec runs the command: exit 0 up, else down; a stdout line "weight N"
// sets the weight (keepalived's misc_dynamic).
func (p *probe) exec(ctx context.Context, d *dialer) Result {
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", p.check.Command)
	cmd.Env = p.env
	// Its own process group, killed whole at the timeout: a shell's
	// children must not outlive the check.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 100 * time.Millisecond
	var out limitedBuffer
	out.max = 4096
	cmd.Stdout, cmd.Stderr = &out, &out
	// Started from a thread in the LB's namespace: the command runs there.
	err := d.do(cmd.Start)
	if err == nil {
		err = cmd.Wait()
	}
	weight := int32(-1)
	for _, line := range strings.Split(out.String(), "\n") {
		if w, ok := strings.CutPrefix(strings.TrimSpace(line), "weight "); ok {
			if n, err := strconv.ParseUint(strings.TrimSpace(w), 10, 32); err == nil && n <= model.MaxWeight {
				weight = int32(n)
			}
		}
	}
	first, _, _ := strings.Cut(strings.TrimSpace(out.String()), "\n")
	switch {
	case ctx.Err() != nil:
		return fail("timeout after " + p.check.Timeout.String())
	case err == nil:
		r := pass("exit 0")
		r.Weight = weight
		return r
	}
	detail := err.Error()
	if ee, ok := err.(*exec.ExitError); ok {
		detail = "exit " + strconv.Itoa(ee.ExitCode())
	}
	if first != "" {
		detail += ": " + shorten([]byte(first))
	}
	return fail(detail)
}

// agent asks HAProxy's agent protocol: one line of words among up, ready,
// down, fail, stopped, maint, drain and NN%, optionally followed by
// "#description".
func (p *probe) agent(ctx context.Context, d *dialer, deadline time.Time) Result {
	c, err := d.dial(ctx, "tcp", p.check.SourceAddr, p.dst, deadline)
	if err != nil {
		return p.failErr(err)
	}
	defer c.Close()
	c.SetDeadline(deadline)
	if len(p.send) > 0 {
		if _, err := c.Write(p.send); err != nil {
			return p.failErr(err)
		}
	}
	line, err := bufio.NewReaderSize(io.LimitReader(c, 512), 512).ReadString('\n')
	if err != nil && (err != io.EOF || line == "") {
		if err == io.EOF {
			return fail("agent closed without an answer")
		}
		return p.failErr(err)
	}
	return parseAgent(line)
}

// parseAgent reads one agent answer.
func parseAgent(line string) Result {
	line, desc, _ := strings.Cut(line, "#")
	desc = strings.TrimSpace(desc)
	r := pass("agent")
	state, said := "", []string{}
	for _, w := range strings.FieldsFunc(strings.ToLower(line), func(c rune) bool { return c == ' ' || c == ',' || c == '\t' || c == '\r' || c == '\n' }) {
		switch {
		case w == "up" || w == "ready":
			if w == "ready" {
				r.Percent = 100
			}
			state = "up"
		case w == "down" || w == "fail" || w == "stopped" || w == "maint":
			state = w
		case w == "drain":
			r.Percent = 0
		case strings.HasSuffix(w, "%"):
			n, err := strconv.ParseUint(strings.TrimSuffix(w, "%"), 10, 16)
			if err != nil || n > 1000 {
				return fail("agent: bad weight " + w)
			}
			r.Percent = int32(n)
		default:
			continue
		}
		said = append(said, w)
	}
	if len(said) == 0 {
		return fail("agent: no known word in " + strconv.Quote(shorten([]byte(strings.TrimSpace(line)))))
	}
	r.Detail = "agent " + strings.Join(said, " ")
	if desc != "" {
		r.Detail += " (" + desc + ")"
	}
	if state != "" && state != "up" {
		r.OK, r.Now = false, true
	}
	return r
}

func shorten(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "..."
	}
	return string(b)
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
