package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

func (a *app) bgpCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "bgp [--json]",
		Short: "Show the BGP speaker's sessions and announced routes",
		Long: `Show the daemon's BGP sessions (one line per router: address, AS, state,
uptime, updates received and sent) and the VIP routes it announces, with
their communities, MED and local-pref. A VIP is announced only while a farm
on it is in the kernel, up, and (with withdraw-when-down) has a serving
backend, and not before connection sync has caught up with the peers; the
header says when announcements are held back and why. The daemon runs a
speaker only with --bgp-config (docs/ha.md).`,
		Example: `  xlb bgp
  xlb bgp --json`,
		Args: args(),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client(cmd)
			if err != nil {
				return err
			}
			st, err := c.BGP(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				b, _ := json.MarshalIndent(st, "", "  ")
				_, err := fmt.Fprintln(a.out, string(b))
				return err
			}
			fmt.Fprintf(a.out, "BGP router-id %s, local AS %d", st.RouterID, st.AS)
			if !st.Ready {
				fmt.Fprintf(a.out, ", announcements held back: %s", st.Waiting)
			}
			fmt.Fprintln(a.out)
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "Peer\tAS\tState\tUptime\tUpdates in/out")
			for _, s := range st.Sessions {
				up := s.Uptime
				if up == "" {
					up = "-"
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d/%d\n", s.Address, s.AS, s.State, up, s.Received, s.Sent)
			}
			tw.Flush()
			fmt.Fprintln(a.out)
			tw = tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "Route\tNext hop\tCommunities\tMED\tLocal-pref")
			for _, r := range st.Routes {
				med, lp := "-", "-"
				if r.MED != nil {
					med = fmt.Sprint(*r.MED)
				}
				if r.LocalPref != nil {
					lp = fmt.Sprint(*r.LocalPref)
				}
				cs := strings.Join(r.Communities, " ")
				if cs == "" {
					cs = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Prefix, r.NextHop, cs, med, lp)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "the API's JSON")
	return cmd
}

func (a *app) syncCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sync",
		Short: "Show connection sync's peers and counters",
		Long: `Show this node's connection sync (daemon --sync-listen): each peer, whether
this node's stream to it is connected and whether the peer's whole state has
arrived here, then the counters as JSON (frames, connections sent, received
and installed, events dropped, and what was refused: unconfigured peers, bad
MACs, malformed frames).`,
		Example: `  xlb sync`,
		Args:    args(),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client(cmd)
			if err != nil {
				return err
			}
			st, err := c.Sync(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "sync %s, ready %v", st.Listen, st.Ready)
			if st.Waiting != "" {
				fmt.Fprintf(a.out, " (%s)", st.Waiting)
			}
			fmt.Fprintln(a.out)
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "Peer\tSending\tCaught up\tLast error")
			for _, p := range st.Peers {
				fmt.Fprintf(tw, "%s\t%s\t%v\t%s\n", p.Address, p.Sending, p.CaughtUp, p.LastErr)
			}
			tw.Flush()
			b, _ := json.MarshalIndent(st.Counters, "", "  ")
			_, err = fmt.Fprintln(a.out, string(b))
			return err
		},
	}
	return cmd
}
