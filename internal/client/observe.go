package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
)

// ListRateText streams the listing with rates (ipvsadm -L --rate) to w.
func (c *Client) ListRateText(ctx context.Context, w io.Writer, numeric bool) error {
	path := "/farms?format=ipvsadm&rate=1"
	if numeric {
		path += "&numeric=1"
	}
	_, err := c.stream(ctx, path, w)
	return err
}

// ListConnCountsText streams the listing with each backend's active and
// inactive connections (ipvsadm -L's ActiveConn and InActConn) to w.
func (c *Client) ListConnCountsText(ctx context.Context, w io.Writer, numeric bool) error {
	path := "/farms?format=ipvsadm&conns=1"
	if numeric {
		path += "&numeric=1"
	}
	_, err := c.stream(ctx, path, w)
	return err
}

// ConnQuery selects connections: of one farm (all when ""), one backend,
// one client address.
type ConnQuery struct {
	Farm, Backend, Client string
}

func (q ConnQuery) values() url.Values {
	v := url.Values{}
	if q.Backend != "" {
		v.Set("backend", q.Backend)
	}
	if q.Client != "" {
		v.Set("client", q.Client)
	}
	return v
}

// ListConnsText streams the connection listing (ipvsadm -Lcn) to w.
func (c *Client) ListConnsText(ctx context.Context, w io.Writer, q ConnQuery) error {
	v := q.values()
	v.Set("format", "ipvsadm")
	path := "/connections?"
	if q.Farm != "" {
		path = farmPath(q.Farm) + "/connections?"
	}
	_, err := c.stream(ctx, path+v.Encode(), w)
	return err
}

// DeleteConns deletes a farm's connections that match q and returns how
// many the daemon deleted.
func (c *Client) DeleteConns(ctx context.Context, q ConnQuery) (int, error) {
	path := farmPath(q.Farm) + "/connections"
	if v := q.values(); len(v) > 0 {
		path += "?" + v.Encode()
	}
	resp, err := c.do(ctx, http.MethodDelete, path, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := strconv.Atoi(resp.Header.Get("X-Xlb-Connections-Deleted"))
	if err != nil {
		return 0, fmt.Errorf("the daemon did not say how many connections it deleted")
	}
	return n, nil
}

// Rates are a farm's or backend's rates as the API sends them (decimal
// strings, per second).
type Rates struct {
	CPS    string `json:"cps"`
	InPPS  string `json:"in-pps"`
	OutPPS string `json:"out-pps"`
	InBPS  string `json:"in-bps"`
	OutBPS string `json:"out-bps"`
}

// FarmRates are a farm's rates and its backends'.
type FarmRates struct {
	Name string `json:"name"`
	Rates
	Backends []struct {
		Name string `json:"name"`
		Rates
	} `json:"backends"`
}

// Rates reads a farm's rates.
func (c *Client) Rates(ctx context.Context, farm string) (*FarmRates, error) {
	body, err := c.call(ctx, http.MethodGet, farmPath(farm)+"/rates", nil)
	if err != nil {
		return nil, err
	}
	var out FarmRates
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("decode rates from the daemon: %w", err)
	}
	return &out, nil
}
