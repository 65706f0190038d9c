package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/xlb-lb/xlb/internal/events"
)

// Events streams the daemon's events (GET /events) to fn until ctx ends,
// the daemon closes the stream, or fn returns an error. since > 0 first
// replays the kept events after that id. dropped events (the client was
// too slow) are passed as an event of kind "dropped" whose Count says how
// many.
func (c *Client) Events(ctx context.Context, since uint64, fn func(events.Event) error) error {
	path := "/events"
	if since > 0 {
		path += "?since=" + strconv.FormatUint(since, 10)
	}
	resp, err := c.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	var kind, data string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if data == "" {
				continue
			}
			var ev events.Event
			if kind == "dropped" {
				var d struct{ Dropped int }
				if err := json.Unmarshal([]byte(data), &d); err != nil {
					return fmt.Errorf("decode event from the daemon: %w", err)
				}
				ev = events.Event{Kind: "dropped", Count: &d.Dropped}
			} else if err := json.Unmarshal([]byte(data), &ev); err != nil {
				return fmt.Errorf("decode event from the daemon: %w", err)
			}
			if err := fn(ev); err != nil {
				return err
			}
			kind, data = "", ""
		case strings.HasPrefix(line, "event: "):
			kind = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data += strings.TrimPrefix(line, "data: ")
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read events from the daemon: %w", err)
	}
	return nil
}
