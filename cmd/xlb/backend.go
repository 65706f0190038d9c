package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/xlb-lb/xlb/internal/client"
)

func (a *app) backendCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "backend",
		Aliases: []string{"be"},
		Short:   "Add, change and delete a farm's backends (real servers)",
		Example: `  xlb backend add web be1 --ip 10.200.0.11 --port 8080
  xlb backend set web be1 --weight 0      # drain: existing connections stay, no new ones
  xlb backend set web be1 --state off
  xlb backend del web be1`,
		Args: args(),
	}
	cmd.AddCommand(a.backendAddCmd(), a.backendSetCmd(), a.backendDelCmd())
	return cmd
}

// backendExists reports whether the farm has that backend; a missing farm is an error.
func backendExists(ctx context.Context, c *client.Client, farm, name string) (bool, error) {
	f, err := c.GetFarm(ctx, farm)
	if err != nil {
		return false, err
	}
	b, _ := f.Backend(name)
	return b != nil, nil
}

func (a *app) backendAddCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "add FARM NAME --ip ADDR [flags]",
		Short: "Add a backend to a farm (fields not given take nftlb's defaults)",
		Example: `  xlb backend add web be1 --ip 10.200.0.11 --port 8080
  xlb backend add web be2 --ip 10.200.0.12 --port 8080 --weight 2 --priority 2   # standby`,
		Args: args("FARM", "NAME"),
	}
	body := fieldFlagSet(cmd, backendFlags())
	check := checkFlagSet(cmd, false)
	cmd.RunE = func(cmd *cobra.Command, argv []string) error {
		farm, name := argv[0], argv[1]
		c, err := a.client(cmd)
		if err != nil {
			return err
		}
		exists, err := backendExists(cmd.Context(), c, farm, name)
		if err != nil {
			return err
		}
		if exists {
			return fmt.Errorf("farm %q backend %q already exists (change it with: xlb backend set %s %s ...)", farm, name, farm, name)
		}
		b, _ := body(map[string]string{"name": name})
		b, _ = check(b)
		return c.PutBackends(cmd.Context(), farm, b)
	}
	return cmd
}

func (a *app) backendSetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "set FARM NAME --FIELD VALUE...",
		Short: "Change fields of a backend (only the flags given change)",
		Example: `  xlb backend set web be1 --weight 5
  xlb backend set web be1 --weight 0      # drain
  xlb backend set web be1 --state down
  xlb backend set web be1 --check tcp --check-port 9000   # override the farm's check
  xlb backend set web be1 --check none                    # do not check this one`,
		Args: args("FARM", "NAME"),
	}
	body := fieldFlagSet(cmd, backendFlags())
	check := checkFlagSet(cmd, false)
	cmd.RunE = func(cmd *cobra.Command, argv []string) error {
		farm, name := argv[0], argv[1]
		b, n := body(map[string]string{"name": name})
		b, m := check(b)
		if n+m == 0 {
			return fmt.Errorf("nothing to change: give at least one field flag (see xlb backend set --help)")
		}
		c, err := a.client(cmd)
		if err != nil {
			return err
		}
		exists, err := backendExists(cmd.Context(), c, farm, name)
		if err != nil {
			return err
		}
		if !exists {
			return fmt.Errorf("farm %q backend %q does not exist (add it with: xlb backend add %s %s --ip ADDR)", farm, name, farm, name)
		}
		return c.PutBackends(cmd.Context(), farm, b)
	}
	return cmd
}

func (a *app) backendDelCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "del FARM NAME",
		Aliases: []string{"delete", "rm"},
		Short:   "Delete a backend from a farm",
		Example: `  xlb backend del web be1`,
		Args:    args("FARM", "NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client(cmd)
			if err != nil {
				return err
			}
			return c.DeleteBackend(cmd.Context(), argv[0], argv[1])
		},
	}
}
