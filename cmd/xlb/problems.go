package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

func (a *app) problemsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "problems",
		Short: "List saved farms the daemon loaded with a problem, or set aside, at start",
		Long: `Start-up never refuses the daemon's own saved state. A saved farm that no
longer validates is served as saved ("loaded yes") until a change fixes or
deletes it; one that cannot be served (it does not decode, the data plane
cannot do it, it clashes with another farm, the kernel refuses it) is set
aside ("loaded no"): its saved JSON is in the file shown, under
<state-dir>/set-aside/, and it is no longer part of the state. Fix the value
and send the farm again (xlb farm set, or PUT /farms). Prints nothing when
there is no problem. See docs/operations.md.`,
		Example: `  xlb problems
  xlb farm set web --log-prefix "web: "    # fix a farm listed as loaded`,
		Args: args(),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client(cmd)
			if err != nil {
				return err
			}
			ps, err := c.Problems(cmd.Context())
			if err != nil || len(ps) == 0 {
				return err
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "FARM\tLOADED\tPROBLEM\tFILE")
			for _, p := range ps {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.Farm, p.Loaded, p.Problem, p.File)
			}
			return tw.Flush()
		},
	}
}
