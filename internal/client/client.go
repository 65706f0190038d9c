// Package client is the Go client of xlb's REST API (see api/openapi.yaml).
// The xlb command line talks to the daemon only through it.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/xlb-lb/xlb/internal/cluster/bgp"
	"github.com/xlb-lb/xlb/internal/cluster/connsync"
	"github.com/xlb-lb/xlb/internal/model"
)

// KeyHeader carries the API key.
const KeyHeader = "Key"

// Client calls one xlb daemon.
type Client struct {
	base  string // URL prefix of every request
	where string // the daemon's address, for errors
	key   string
	hc    *http.Client
}

// New returns a client of the daemon at baseURL (e.g. http://127.0.0.1:5555,
// or unix:/var/lib/xlb/api.sock for the daemon's Unix socket) authenticating
// with key. A nil httpClient uses http.DefaultClient (a Unix socket gets a
// client of its own).
func New(baseURL, key string, httpClient *http.Client) *Client {
	if path, ok := strings.CutPrefix(baseURL, "unix:"); ok {
		path = strings.TrimPrefix(path, "//")
		var d net.Dialer
		tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		}}
		return &Client{base: "http://xlb", where: "unix:" + path, key: key, hc: &http.Client{Transport: tr}}
	}
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	base := strings.TrimRight(baseURL, "/")
	return &Client{base: base, where: base, key: key, hc: httpClient}
}

// APIError is an error answered by the daemon.
type APIError struct {
	Status  int    // HTTP status
	Message string // the daemon's message
}

func (e *APIError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("%d %s", e.Status, http.StatusText(e.Status))
	}
	return e.Message
}

// IsNotFound reports whether err is the daemon saying an object does not exist.
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}

// do sends a request and returns the response of a 2xx answer; the caller
// closes its body. Other answers become an *APIError.
func (c *Client) do(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	return c.doType(ctx, method, path, "application/json", body)
}

// doType is do with the body's content type.
func (c *Client) doType(ctx context.Context, method, path, contentType string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, fmt.Errorf("build request %s %s: %w", method, path, err)
	}
	req.Header.Set(KeyHeader, c.key)
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("cannot reach the xlb daemon at %s (is it running? see --api): %w", c.where, unwrapURLError(err))
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	ae := &APIError{Status: resp.StatusCode}
	// nftlb's {"response": "<nftlb's text>. <xlb's message>"}.
	var msg struct {
		Response string `json:"response"`
	}
	if json.Unmarshal(raw, &msg) == nil && msg.Response != "" {
		ae.Message = errorMessage(msg.Response)
	} else if s := strings.TrimSpace(string(raw)); s != "" {
		ae.Message = fmt.Sprintf("%d %s: %s", resp.StatusCode, http.StatusText(resp.StatusCode), s)
	}
	return nil, ae
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// call sends a request and reads the whole answer.
func (c *Client) call(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	resp, err := c.do(ctx, method, path, r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("read answer of %s %s: %w", method, path, err)
	}
	return out, nil
}

func farmPath(name string) string { return "/farms/" + url.PathEscape(name) }

// ListFarms returns every farm, ordered by name.
func (c *Client) ListFarms(ctx context.Context) ([]model.Farm, error) {
	body, err := c.call(ctx, http.MethodGet, "/farms", nil)
	if err != nil {
		return nil, err
	}
	// Unchecked: the daemon may serve a saved farm that no longer
	// validates (GET /state/problems); the client must still read it.
	farms, err := model.DecodeFarmsUnchecked(body)
	if err != nil {
		return nil, fmt.Errorf("decode farms from the daemon: %w", err)
	}
	return farms, nil
}

// ListNames returns the farms' names, ordered.
func (c *Client) ListNames(ctx context.Context) ([]string, error) {
	body, err := c.call(ctx, http.MethodGet, "/farms?format=names", nil)
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(body)), nil
}

// GetFarm returns one farm.
func (c *Client) GetFarm(ctx context.Context, name string) (model.Farm, error) {
	body, err := c.GetFarmJSON(ctx, name)
	if err != nil {
		return model.Farm{}, err
	}
	farms, err := model.DecodeFarmsUnchecked(body) // see ListFarms
	if err != nil {
		return model.Farm{}, fmt.Errorf("decode farm %q from the daemon: %w", name, err)
	}
	if len(farms) != 1 {
		return model.Farm{}, fmt.Errorf("daemon answered %d farms for farm %q", len(farms), name)
	}
	return farms[0], nil
}

// GetFarmJSON returns one farm as the daemon sends it: {"farms":[{...}]}.
func (c *Client) GetFarmJSON(ctx context.Context, name string) ([]byte, error) {
	return c.call(ctx, http.MethodGet, farmPath(name), nil)
}

// PutFarms creates or patches farms: body is nftlb's {"farms":[...]}, all
// applied in one transaction.
func (c *Client) PutFarms(ctx context.Context, body []byte) error {
	_, err := c.call(ctx, http.MethodPut, "/farms", body)
	return err
}

// PutFarm creates or patches one farm; body is a farm object (its name may be left out).
func (c *Client) PutFarm(ctx context.Context, name string, body []byte) error {
	_, err := c.call(ctx, http.MethodPut, farmPath(name), body)
	return err
}

// DeleteFarm deletes a farm and its backends.
func (c *Client) DeleteFarm(ctx context.Context, name string) error {
	_, err := c.call(ctx, http.MethodDelete, farmPath(name), nil)
	return err
}

// PutBackends creates or patches backends of a farm: body is
// {"backends":[...]} or one backend object.
func (c *Client) PutBackends(ctx context.Context, farm string, body []byte) error {
	_, err := c.call(ctx, http.MethodPut, farmPath(farm)+"/backends", body)
	return err
}

// DeleteBackend deletes one backend of a farm.
func (c *Client) DeleteBackend(ctx context.Context, farm, backend string) error {
	_, err := c.call(ctx, http.MethodDelete, farmPath(farm)+"/backends/"+url.PathEscape(backend), nil)
	return err
}

// Dump streams the whole state ({"farms":[...]}, the daemon's bytes
// unchanged) to w.
func (c *Client) Dump(ctx context.Context, w io.Writer) (int64, error) {
	return c.stream(ctx, "/state", w)
}

// Restore replaces the whole state with the farms read from r, in one transaction.
func (c *Client) Restore(ctx context.Context, r io.Reader) error {
	resp, err := c.do(ctx, http.MethodPut, "/state", r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// ListText streams the ipvsadm-style listing to w; numeric shows port
// numbers instead of service names.
func (c *Client) ListText(ctx context.Context, w io.Writer, numeric bool) error {
	path := "/farms?format=ipvsadm"
	if numeric {
		path += "&numeric=1"
	}
	_, err := c.stream(ctx, path, w)
	return err
}

// ListStatsText streams the listing with counters (ipvsadm -L --stats) to w.
func (c *Client) ListStatsText(ctx context.Context, w io.Writer, numeric bool) error {
	path := "/farms?format=ipvsadm&stats=1"
	if numeric {
		path += "&numeric=1"
	}
	_, err := c.stream(ctx, path, w)
	return err
}

// Counters are a farm's or backend's traffic counters as the API sends
// them (decimal strings).
type Counters struct {
	Connections string `json:"connections"`
	InPackets   string `json:"in-packets"`
	OutPackets  string `json:"out-packets"`
	InBytes     string `json:"in-bytes"`
	OutBytes    string `json:"out-bytes"`
}

// FarmCounters are a farm's counters and its backends'.
type FarmCounters struct {
	Name string `json:"name"`
	Counters
	Backends []struct {
		Name string `json:"name"`
		Counters
	} `json:"backends"`
}

// Counters reads a farm's traffic counters.
func (c *Client) Counters(ctx context.Context, farm string) (*FarmCounters, error) {
	body, err := c.call(ctx, http.MethodGet, farmPath(farm)+"/counters", nil)
	if err != nil {
		return nil, err
	}
	var out FarmCounters
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("decode counters from the daemon: %w", err)
	}
	return &out, nil
}

func (c *Client) stream(ctx context.Context, path string, w io.Writer) (int64, error) {
	resp, err := c.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	// A large buffer, and a plain Writer so that io.CopyBuffer uses it
	// (an *os.File's ReadFrom would copy 32 KiB at a time): a 16,000-farm
	// dump is ~11 MB.
	n, err := io.CopyBuffer(plainWriter{w}, resp.Body, make([]byte, 256<<10))
	if err != nil {
		return n, fmt.Errorf("copy answer of GET %s: %w", path, err)
	}
	return n, nil
}

// Version returns the daemon's version information.
func (c *Client) Version(ctx context.Context) (map[string]string, error) {
	body, err := c.call(ctx, http.MethodGet, "/version", nil)
	if err != nil {
		return nil, err
	}
	var v map[string]string
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, fmt.Errorf("decode version: %w", err)
	}
	return v, nil
}

type plainWriter struct{ io.Writer }

// Session is one persistence session as the API lists it.
type Session struct {
	Client  string `json:"client"`
	Backend string `json:"backend"`
	Expires string `json:"expires"` // seconds left; empty for a static session
}

// Sessions lists a farm's persistence sessions.
func (c *Client) Sessions(ctx context.Context, farm string) ([]Session, error) {
	body, err := c.call(ctx, http.MethodGet, farmPath(farm)+"/sessions", nil)
	if err != nil {
		return nil, err
	}
	var out struct {
		Sessions []Session `json:"sessions"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("decode sessions from the daemon: %w", err)
	}
	return out.Sessions, nil
}

// DeleteClientSession deletes one client's session of a farm and returns
// how many sessions were deleted (0 or 1).
func (c *Client) DeleteClientSession(ctx context.Context, farm, client string) (int, error) {
	return c.deleteSessions(ctx, farmPath(farm)+"/sessions/"+url.PathEscape(client))
}

// DeleteBackendSessions deletes a farm's sessions that point at backend
// and returns how many were deleted.
func (c *Client) DeleteBackendSessions(ctx context.Context, farm, backend string) (int, error) {
	return c.deleteSessions(ctx, farmPath(farm)+"/backends/"+url.PathEscape(backend)+"/sessions")
}

func (c *Client) deleteSessions(ctx context.Context, path string) (int, error) {
	resp, err := c.do(ctx, http.MethodDelete, path, nil)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	v := resp.Header.Get(sessionsDeletedHeader)
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("decode answer from the daemon: %s %q", sessionsDeletedHeader, v)
	}
	return n, nil
}

// sessionsDeletedHeader is api.SessionsDeletedHeader (the client does not
// import the server).
const sessionsDeletedHeader = "X-Xlb-Sessions-Deleted"

// errorMessage is xlb's message in an nftlb error text: what follows
// nftlb's own text ("error parsing buffer. farm \"web\": ..."), or the
// whole text when it has no such prefix.
func errorMessage(text string) string {
	for _, prefix := range []string{"invalid request. ", "the structure is invalid. ", "the object to modify is unknown. ",
		"error parsing buffer. ", "error generating rules. ", "error deleting farm. ", "error deleting backend. ",
		"error stopping address. ", "error deleting farm address. ", "error deleting session. "} {
		if rest, ok := strings.CutPrefix(text, prefix); ok {
			return rest
		}
	}
	return text
}

// BGP returns the daemon's BGP sessions and announced routes.
func (c *Client) BGP(ctx context.Context) (bgp.Status, error) {
	var st bgp.Status
	body, err := c.call(ctx, http.MethodGet, "/bgp", nil)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return st, fmt.Errorf("decode BGP status from the daemon: %w", err)
	}
	return st, nil
}

// Where is the daemon's address as errors name it.
func (c *Client) Where() string { return c.where }

// Problem is a saved farm the daemon loaded with a problem, or set aside,
// at its last start (GET /state/problems).
type Problem struct {
	Farm    string `json:"farm"`
	Loaded  string `json:"loaded"` // "yes" or "no"
	Problem string `json:"problem"`
	File    string `json:"file"`
}

// Problems lists the problems of the daemon's saved state.
func (c *Client) Problems(ctx context.Context) ([]Problem, error) {
	body, err := c.call(ctx, http.MethodGet, "/state/problems", nil)
	if err != nil {
		return nil, err
	}
	var out struct {
		Problems []Problem `json:"problems"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("decode problems from the daemon: %w", err)
	}
	return out.Problems, nil
}

// Sync returns the daemon's connection sync peers and counters.
func (c *Client) Sync(ctx context.Context) (connsync.Status, error) {
	var st connsync.Status
	body, err := c.call(ctx, http.MethodGet, "/sync", nil)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return st, fmt.Errorf("decode sync status from the daemon: %w", err)
	}
	return st, nil
}
