package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func (a *app) reconcileCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "reconcile",
		Short: "Make the kernel hold the daemon's state again (repair what other programs changed)",
		Long: `Reconcile the data plane with the daemon's state, as at start, without flushing
anything: what another program changed or deleted in xlb's kernel objects
(nft flush ruleset, a rule or map element deleted by hand, an eBPF program
detached) is put back; what it added to them is removed. The daemon does
this by itself within a second of seeing such a change; this command (or
SIGHUP to the daemon) asks for it. Prints the drift counters. See
docs/operations.md.`,
		Example: `  xlb reconcile
  kill -HUP "$(pidof xlb)"     # the same, by signal`,
		Args: args(),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client(cmd)
			if err != nil {
				return err
			}
			r, err := c.Reconcile(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "reconciled %s farms; drift watch %s: %s changes by other programs seen, %s repaired by reconciles (%s failed), %s reconciles asked for\n",
				r.Farms, r.Watching, r.Seen, r.Repairs, r.Failed, r.Reconciles)
			return nil
		},
	}
}
