package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/xlb-lb/xlb/internal/events"
)

func (a *app) eventsCmd() *cobra.Command {
	var asJSON bool
	var since uint64
	cmd := &cobra.Command{
		Use:   "events [--json] [--since ID]",
		Short: "Follow the daemon's events (health transitions, weights, quorum, flushes)",
		Long: `Print the daemon's events as they happen, one a line, until interrupted:
a backend going up or down by its health check (with the reason, e.g.
"connect refused", "timeout after 1s", "HTTP 503"), its effective weight
changing (warm-up, agent, exec), a farm losing or regaining its quorum, a
down backend's connections being flushed. --json prints each event as the
API's JSON object. --since ID first replays the events after ID that the
daemon still holds (the last 1,024).`,
		Example: `  xlb events
  xlb events --json | jq 'select(.kind == "health")'`,
		Args: args(),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client(cmd)
			if err != nil {
				return err
			}
			return c.Events(cmd.Context(), since, func(ev events.Event) error {
				var line string
				if asJSON {
					b, _ := json.Marshal(ev)
					line = string(b)
				} else {
					line = formatEvent(ev)
				}
				_, err := fmt.Fprintln(a.out, line)
				return err
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object a line")
	cmd.Flags().Uint64Var(&since, "since", 0, "replay the kept events after this id first")
	return cmd
}

// formatEvent writes an event as one line of text.
func formatEvent(ev events.Event) string {
	var b strings.Builder
	if !ev.Time.IsZero() {
		b.WriteString(ev.Time.Local().Format(time.RFC3339Nano))
		b.WriteByte(' ')
	}
	b.WriteString(ev.Kind)
	if ev.Farm != "" {
		fmt.Fprintf(&b, " farm %s", ev.Farm)
	}
	if ev.Backend != "" {
		fmt.Fprintf(&b, " backend %s", ev.Backend)
	}
	if ev.State != "" {
		fmt.Fprintf(&b, " %s", ev.State)
	}
	if ev.Weight != nil {
		fmt.Fprintf(&b, " weight %d", *ev.Weight)
	}
	if ev.Count != nil {
		fmt.Fprintf(&b, " count %d", *ev.Count)
	}
	if ev.Reason != "" {
		fmt.Fprintf(&b, ": %s", ev.Reason)
	}
	return b.String()
}
