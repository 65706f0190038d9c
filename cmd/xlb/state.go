package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/xlb-lb/xlb/internal/client"
)

func (a *app) listCmd() *cobra.Command {
	var numeric, stats, rate, conns, counts bool
	var q client.ConnQuery
	cmd := &cobra.Command{
		Use:   "list [-n] [--stats | --rate | --conns | -c [--farm F] [--backend B] [--client IP]]",
		Short: "List farms and backends as ipvsadm -L does",
		Long: `List every farm and its backends as a table like ipvsadm -L. The Forward
column shows the mode: Masq (snat), Dnat (dnat), Route (dsr), Stls (stlsdnat).
Without -n, well-known ports are shown by their /etc/services names (addresses
are never looked up).

With --stats, the table shows counters instead, as ipvsadm -L --stats --exact:
connections, packets and bytes in (client to backend) and out (backend to
client) of each farm and backend. Both data planes keep them (the nft plane
unless the daemon runs with --nft-counters=false).

With --rate, the table shows rates per second, as ipvsadm -L --rate: new
connections (CPS), packets in and out (InPPS, OutPPS), bytes in and out
(InBPS, OutBPS), estimated in the daemon as IPVS does (every 2 s, moving a
quarter of the way to the last 2 s' rate).

With --conns, each backend's line ends with its tracked connections, "active
N inactive M" (ipvsadm -L's ActiveConn and InActConn: established TCP
connections, and the others), counted in one walk of the connection table.

With -c, the tracked connections, as ipvsadm -Lcn: protocol, seconds left
(mm:ss), state, client, VIP and backend; --farm, --backend and --client
select some of them. Delete connections with "xlb connections delete".`,
		Example: `  xlb list -n
  xlb list
  xlb list -n --stats
  xlb list -n --rate
  xlb list -n --conns
  xlb list -c
  xlb list -c --farm web --client 192.0.2.7`,
		Args: args(),
		RunE: func(cmd *cobra.Command, argv []string) error {
			n := 0
			for _, b := range []bool{stats, rate, conns, counts} {
				if b {
					n++
				}
			}
			if n > 1 {
				return fmt.Errorf("--stats, --rate, --conns and -c: give one of them")
			}
			if !conns && (q.Farm != "" || q.Backend != "" || q.Client != "") {
				return fmt.Errorf("--farm, --backend and --client select connections: only with -c")
			}
			c, err := a.client(cmd)
			if err != nil {
				return err
			}
			switch {
			case stats:
				return c.ListStatsText(cmd.Context(), a.out, numeric)
			case rate:
				return c.ListRateText(cmd.Context(), a.out, numeric)
			case counts:
				return c.ListConnCountsText(cmd.Context(), a.out, numeric)
			case conns:
				return c.ListConnsText(cmd.Context(), a.out, q)
			}
			return c.ListText(cmd.Context(), a.out, numeric)
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&numeric, "numeric", "n", false, "numeric ports (no /etc/services names)")
	f.BoolVar(&stats, "stats", false, "counters per farm and backend (connections, packets, bytes)")
	f.BoolVar(&rate, "rate", false, "rates per farm and backend (CPS, InPPS, OutPPS, InBPS, OutBPS)")
	f.BoolVarP(&conns, "connections", "c", false, "tracked connections (as ipvsadm -Lc)")
	f.BoolVar(&counts, "conns", false, "each backend's active and inactive connections (ipvsadm's ActiveConn, InActConn)")
	f.StringVar(&q.Farm, "farm", "", "with -c: only this farm's connections")
	f.StringVar(&q.Backend, "backend", "", "with -c: only the connections to the backend of this name")
	f.StringVar(&q.Client, "client", "", "with -c: only the connections of this client address")
	return cmd
}

func (a *app) connectionsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "connections",
		Short: "Delete tracked connections (list them with xlb list -c)",
		Example: `  xlb list -c --farm web
  xlb connections delete web --client 192.0.2.7`,
	}
	var q client.ConnQuery
	del := &cobra.Command{
		Use:   "delete FARM [--client IP] [--backend NAME]",
		Short: "Delete a farm's tracked connections: of a client, of a backend, or all",
		Long: `Delete the farm's tracked connections that match --client and --backend
(all of the farm's with neither). The next packet of a deleted TCP
connection is refused unless it opens a new connection; a UDP flow is
scheduled anew. Prints how many connections were deleted.`,
		Example: `  xlb connections delete web --client 192.0.2.7
  xlb connections delete web --backend be2`,
		Args: args("FARM"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client(cmd)
			if err != nil {
				return err
			}
			q.Farm = argv[0]
			n, err := c.DeleteConns(cmd.Context(), q)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "%d connections deleted\n", n)
			return nil
		},
	}
	del.Flags().StringVar(&q.Client, "client", "", "only the connections of this client address")
	del.Flags().StringVar(&q.Backend, "backend", "", "only the connections to the backend of this name")
	cmd.AddCommand(del)
	return cmd
}

func (a *app) dumpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "dump",
		Short: "Write the whole state as JSON to stdout",
		Long: `Write every farm with every field ({"farms":[...]}, nftlb's format) to stdout,
streamed from the daemon as is. "xlb restore" takes it back.`,
		Example: `  xlb dump
  xlb dump | jq '.farms[].name'`,
		Args: args(),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client(cmd)
			if err != nil {
				return err
			}
			_, err = c.Dump(cmd.Context(), a.out)
			return err
		},
	}
}

func (a *app) saveCmd() *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "save [-f FILE]",
		Short: "Save the whole state as JSON to a file (or stdout)",
		Long: `Save every farm, as "xlb dump" writes it. With -f the file is replaced
atomically (written to a temporary file, synced, then renamed), so it always
holds a complete state.`,
		Example: `  xlb save -f /etc/xlb/state.json
  xlb save > state.json`,
		Args: args(),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client(cmd)
			if err != nil {
				return err
			}
			if file == "" || file == "-" {
				_, err = c.Dump(cmd.Context(), a.out)
				return err
			}
			return writeFileAtomic(file, func(w io.Writer) error {
				_, err := c.Dump(cmd.Context(), w)
				return err
			})
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "file to write (default: stdout)")
	return cmd
}

// writeFileAtomic writes a file through a synced temporary file in the same
// directory and a rename, so readers see the old or the new file, never part.
func writeFileAtomic(path string, write func(io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("save to %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	bw := bufio.NewWriterSize(tmp, 256<<10)
	if err := write(bw); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("save to %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("save to %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save to %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("save to %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync() // make the rename durable; best effort
		d.Close()
	}
	return nil
}

func (a *app) restoreCmd() *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "restore [-f FILE]",
		Short: "Replace the whole state with a saved one (one transaction)",
		Long: `Replace every farm with those of a saved state ("xlb save" or "xlb dump"
output, or any nftlb {"farms":[...]} document): farms not in it are deleted.
It is one transaction: if anything in it is refused, nothing changes.`,
		Example: `  xlb restore -f /etc/xlb/state.json
  xlb dump > before.json && xlb restore < before.json`,
		Args: args(),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client(cmd)
			if err != nil {
				return err
			}
			in := a.in
			if file != "" && file != "-" {
				f, err := os.Open(file)
				if err != nil {
					return fmt.Errorf("restore: %w", err)
				}
				defer f.Close()
				in = f
			}
			return c.Restore(cmd.Context(), in)
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "file to read (default: stdin)")
	return cmd
}
