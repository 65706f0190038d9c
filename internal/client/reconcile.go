package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
)

// Reconciled is POST /reconcile's reply: the farms in the state and the
// daemon's drift counters (as the API writes them, strings).
type Reconciled struct {
	Farms      string `json:"farms"`
	Watching   string `json:"drift-watch"`
	Seen       string `json:"drift-seen"`
	Repairs    string `json:"drift-repairs"`
	Failed     string `json:"drift-repairs-failed"`
	Reconciles string `json:"reconciles"`
}

// Reconcile asks the daemon to make the kernel hold its state again.
func (c *Client) Reconcile(ctx context.Context) (Reconciled, error) {
	var out Reconciled
	body, err := c.call(ctx, http.MethodPost, "/reconcile", nil)
	if err != nil {
		return out, err
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return out, fmt.Errorf("decode the daemon's reply to reconcile: %w", err)
	}
	return out, nil
}
