package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/xlb-lb/xlb/internal/model"
)

func tablePath(name string) string { return "/tables/" + url.PathEscape(name) }

// CreateTable creates a table from its JSON definition (POST /tables).
func (c *Client) CreateTable(ctx context.Context, body []byte) error {
	_, err := c.call(ctx, http.MethodPost, "/tables", body)
	return err
}

// PutTable changes a table's definition (PUT /tables/{name}): a patch.
func (c *Client) PutTable(ctx context.Context, name string, body []byte) error {
	_, err := c.call(ctx, http.MethodPut, tablePath(name), body)
	return err
}

// DestroyTable removes a table.
func (c *Client) DestroyTable(ctx context.Context, name string) error {
	_, err := c.call(ctx, http.MethodDelete, tablePath(name), nil)
	return err
}

// FlushTable removes every entry of a table.
func (c *Client) FlushTable(ctx context.Context, name string) error {
	_, err := c.call(ctx, http.MethodPost, tablePath(name)+"/flush", nil)
	return err
}

// SwapTables exchanges the entries of two tables.
func (c *Client) SwapTables(ctx context.Context, a, b string) error {
	_, err := c.call(ctx, http.MethodPost, tablePath(a)+"/swap/"+url.PathEscape(b), nil)
	return err
}

// TableInfo is a table's definition as the daemon shows it.
type TableInfo struct {
	Name      string   `json:"name"`
	Type      string   `json:"type"`
	Family    string   `json:"family"`
	Valtype   string   `json:"valtype"`
	Limit     string   `json:"limit"`
	Locked    string   `json:"locked"`
	Timeout   string   `json:"timeout"`
	Verdict   string   `json:"verdict"`
	LogPrefix string   `json:"log-prefix"`
	Priority  string   `json:"priority"`
	Count     string   `json:"count"`
	Users     []string `json:"users,omitempty"`
	Memory    string   `json:"memory,omitempty"`
	Algorithm string   `json:"algorithm,omitempty"`
}

// Table returns a table's definition; detail adds memory, algorithm and
// users.
func (c *Client) Table(ctx context.Context, name string, detail bool) (TableInfo, error) {
	path := tablePath(name)
	if detail {
		path += "?detail=1"
	}
	var t TableInfo
	body, err := c.call(ctx, http.MethodGet, path, nil)
	if err != nil {
		return t, err
	}
	if err := json.Unmarshal(body, &t); err != nil {
		return t, fmt.Errorf("decode table %q from the daemon: %w", name, err)
	}
	return t, nil
}

// Tables returns every table's definition.
func (c *Client) Tables(ctx context.Context) ([]TableInfo, error) {
	body, err := c.call(ctx, http.MethodGet, "/tables", nil)
	if err != nil {
		return nil, err
	}
	var out struct {
		Tables []TableInfo `json:"tables"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("decode tables from the daemon: %w", err)
	}
	return out.Tables, nil
}

// ListEntries streams a table's entries as text lines (KEY [VALUE]
// [timeout N]) to w.
func (c *Client) ListEntries(ctx context.Context, name string, w io.Writer) error {
	_, err := c.stream(ctx, tablePath(name)+"/entries?format=text", w)
	return err
}

// BatchResult is the daemon's answer to a batch of entries.
type BatchResult struct {
	Response string `json:"response"`
	Done     int    `json:"done"`
	Failed   int    `json:"failed"`
	Errors   []struct {
		Key   string `json:"key"`
		Error string `json:"error"`
	} `json:"errors"`
}

// EntryBatch sends a batch of entries as text lines (add, or with del
// delete). A batch where every entry failed comes back as an *APIError.
func (c *Client) EntryBatch(ctx context.Context, name string, lines io.Reader, del bool, opts model.BatchOptions) (BatchResult, error) {
	method := http.MethodPost
	if del {
		method = http.MethodDelete
	}
	q := url.Values{}
	if opts.Atomic {
		q.Set("atomic", "1")
	}
	if opts.Update {
		q.Set("update", "1")
	}
	path := tablePath(name) + "/entries"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out BatchResult
	resp, err := c.doType(ctx, method, path, "text/plain", lines)
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return out, fmt.Errorf("decode the answer to a batch of table %q: %w", name, err)
	}
	return out, nil
}

// Lookup returns the entry matching key, as JSON.
func (c *Client) Lookup(ctx context.Context, name, key string) ([]byte, error) {
	return c.call(ctx, http.MethodGet, tablePath(name)+"/lookup/"+url.PathEscape(key), nil)
}

// TableCounters fetches the counters of a table's entries (GET
// /tables/{name}/counters): those that matched packets, in key order.
func (c *Client) TableCounters(ctx context.Context, name string) (TableCounters, error) {
	var out TableCounters
	body, err := c.call(ctx, http.MethodGet, tablePath(name)+"/counters", nil)
	if err != nil {
		return out, err
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return out, fmt.Errorf("decode counters of table %q: %w", name, err)
	}
	return out, nil
}

// TableCounters is the body of GET /tables/{name}/counters.
type TableCounters struct {
	Name    string `json:"name"`
	Entries []struct {
		Key     string `json:"key"`
		Packets string `json:"packets"`
		Bytes   string `json:"bytes"`
	} `json:"entries"`
}
