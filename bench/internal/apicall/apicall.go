// Package apicall is the benchmarks' small client of the daemon's API: one
// request with its key, and the wait for a daemon to answer.
package apicall

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"time"
)

// Client sends requests to the API at Base ("http://HOST:PORT") with Key.
type Client struct {
	HTTP *http.Client
	Base string
	Key  string
}

// Call sends one request; a status of 300 or more is an error with the
// body.
func (c Client) Call(ctx context.Context, method, path string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Key", c.Key)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, buf.Bytes())
	}
	return nil
}

// WaitReady waits up to 10 s for the daemon to answer GET /farms.
func (c Client) WaitReady(ctx context.Context) error {
	for range 100 {
		if c.Call(ctx, "GET", "/farms", nil) == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("xlb daemon did not become ready at %s", c.Base)
}
