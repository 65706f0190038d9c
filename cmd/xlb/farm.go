package main

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/xlb-lb/xlb/internal/client"
)

// fieldFlag is a command-line flag for one wire field; its name is the
// field's nftlb JSON key, so flags, API bodies and error messages agree.
type fieldFlag struct {
	name  string
	alias string // a short ipvsadm/CLI-friendly name, or ""
	usage string
}

func farmFlags() []fieldFlag {
	return []fieldFlag{
		{"virtual-addr", "vip", "virtual IPv4 or IPv6 address (family dual: one of each, comma separated)"},
		{"virtual-ports", "ports", "ports and ranges, e.g. 80,443,1000-2000 (empty: every port)"},
		{"protocol", "proto", "tcp, udp, sctp or all"},
		{"family", "", "ipv4, ipv6 or dual"},
		{"mode", "", "snat, dnat, dsr or stlsdnat"},
		{"scheduler", "sched", "rr, weight, hash, symhash, maglev, lc or wlc (lc and wlc: eBPF plane, tcp)"},
		{"sched-param", "", "hash keys for hash/symhash: srcip, dstip, srcport, dstport, srcmac (space separated)"},
		{"persistence", "", "none, srcip, dstip, srcport, dstport, srcmac or several joined by '-'"},
		{"persist-ttl", "", "persistence timeout in seconds"},
		{"source-addr", "", "snat: fixed source address instead of masquerade"},
		{"helper", "", "none, amanda, ftp, h323, irc, netbios-ns, pptp, sane, sip, snmp or tftp"},
		{"log", "", "none, or hooks input, forward, output (space separated)"},
		{"log-prefix", "", "prefix of log lines"},
		{"mark", "", "32-bit mark, e.g. 0x10; without --vip the farm serves this firewall mark (ipvsadm -f)"},
		{"state", "", "up, down or off"},
		{"new-rtlimit", "", "new connections per second (0: unlimited)"},
		{"new-rtlimit-burst", "", "burst of new connections"},
		{"rst-rtlimit", "", "TCP resets per second (0: unlimited)"},
		{"rst-rtlimit-burst", "", "burst of TCP resets"},
		{"est-connlimit", "", "established connections (0: unlimited)"},
		{"tcp-strict", "", "on or off"},
		{"iface", "", "mode dsr: interface where the VIP's traffic arrives (empty: found by the data plane)"},
		{"oface", "", "mode dsr: interface towards the backends (empty: found by the data plane)"},
		{"ether-addr", "", "mode dsr: source MAC of forwarded frames (empty: oface's MAC)"},
	}
}

func backendFlags() []fieldFlag {
	return []fieldFlag{
		{"ip-addr", "ip", "backend IPv4 or IPv6 address"},
		{"port", "", "backend port (empty: the port the client connected to)"},
		{"weight", "", "weight 0-10000 (0 drains: no new connections)"},
		{"priority", "", "priority 1 or more: backends above priority 1 are spares that step in as backends of the levels below go down (nftlb's rule, docs/api.md)"},
		{"state", "", "up, down or off"},
		{"mark", "", "32-bit mark set on the backend's packets, e.g. 0x1"},
		{"est-connlimit", "", "established connections (0: unlimited)"},
		{"ether-addr", "", "mode dsr: the backend's MAC (empty: looked up in the LB's neighbour table)"},
	}
}

// fieldFlagSet registers the flags of a field table on cmd and returns a
// function that builds the JSON object of the flags given on the command
// line (only those: a patch), plus the extra fields.
func fieldFlagSet(cmd *cobra.Command, fields []fieldFlag) func(extra map[string]string) ([]byte, int) {
	values := make([]string, len(fields))
	aliases := map[string]string{}
	for i, f := range fields {
		usage := f.usage
		if f.alias != "" {
			usage += " (alias --" + f.alias + ")"
			aliases[f.alias] = f.name
		}
		cmd.Flags().StringVar(&values[i], f.name, "", usage)
	}
	cmd.Flags().SortFlags = false
	cmd.Flags().SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if long, ok := aliases[name]; ok {
			name = long
		}
		return pflag.NormalizedName(name)
	})
	return func(extra map[string]string) ([]byte, int) {
		obj := make(map[string]string, len(fields)+len(extra))
		n := 0
		for i, f := range fields {
			if cmd.Flags().Changed(f.name) {
				obj[f.name] = values[i]
				n++
			}
		}
		for k, v := range extra {
			obj[k] = v
		}
		body, _ := json.Marshal(obj) // a map of strings always encodes
		return body, n
	}
}

func (a *app) farmCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "farm",
		Short: "Add, change, delete and show farms (virtual services)",
		Long: `A farm is a virtual service: an address with ports and a protocol (or a
firewall mark), how it forwards (mode) and schedules, and its backends.
Flags are named after nftlb's JSON keys.`,
		Example: `  xlb farm add web --vip 192.0.2.10 --ports 80,443 --proto tcp --mode snat --sched rr
  xlb farm set web --persistence srcip --persist-ttl 300
  xlb farm list
  xlb farm show web
  xlb farm del web`,
		Args: args(),
	}
	cmd.AddCommand(a.farmAddCmd(), a.farmSetCmd(), a.farmDelCmd(), a.farmListCmd(), a.farmShowCmd())
	return cmd
}

func (a *app) farmAddCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "add NAME --vip ADDR [--ports PORTS] [flags]",
		Short: "Add a farm (fields not given take nftlb's defaults)",
		Example: `  xlb farm add web --vip 192.0.2.10 --ports 80,443 --proto tcp --mode snat --sched rr
  xlb farm add dns6 --family ipv6 --vip 2001:db8::53 --ports 53 --proto udp --sched hash --sched-param "srcip srcport"
  xlb farm add fw10 --mark 0x10 --proto all --mode dnat     # firewall-mark service, like ipvsadm -A -f 16`,
		Args: args("NAME"),
	}
	body := fieldFlagSet(cmd, farmFlags())
	check := checkFlagSet(cmd, true)
	cmd.RunE = func(cmd *cobra.Command, argv []string) error {
		c, err := a.client(cmd)
		if err != nil {
			return err
		}
		name := argv[0]
		ctx := cmd.Context()
		if _, err := c.GetFarmJSON(ctx, name); err == nil {
			return fmt.Errorf("farm %q already exists (change it with: xlb farm set %s ...)", name, name)
		} else if !client.IsNotFound(err) {
			return err
		}
		b, _ := body(map[string]string{"name": name})
		b, _ = check(b)
		return c.PutFarm(ctx, name, b)
	}
	return cmd
}

func (a *app) farmSetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "set NAME --FIELD VALUE...",
		Short: "Change fields of a farm (only the flags given change)",
		Example: `  xlb farm set web --sched weight
  xlb farm set web --persistence srcip --persist-ttl 300
  xlb farm set web --state off
  xlb farm set web --check tcp --inter 1s --fall 2
  xlb farm set web --check http --path /health --status 200-299 --timeout 500ms --on-down flush
  xlb farm set web --check none                  # no health checks`,
		Args: args("NAME"),
	}
	body := fieldFlagSet(cmd, farmFlags())
	check := checkFlagSet(cmd, true)
	cmd.RunE = func(cmd *cobra.Command, argv []string) error {
		b, n := body(map[string]string{"name": argv[0]})
		b, m := check(b)
		if n+m == 0 {
			return fmt.Errorf("nothing to change: give at least one field flag (see xlb farm set --help)")
		}
		c, err := a.client(cmd)
		if err != nil {
			return err
		}
		// Without this check the upsert would create a farm from a typo.
		if _, err := c.GetFarmJSON(cmd.Context(), argv[0]); err != nil {
			return err
		}
		return c.PutFarm(cmd.Context(), argv[0], b)
	}
	return cmd
}

func (a *app) farmDelCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "del NAME",
		Aliases: []string{"delete", "rm"},
		Short:   "Delete a farm and its backends",
		Example: `  xlb farm del web`,
		Args:    args("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client(cmd)
			if err != nil {
				return err
			}
			return c.DeleteFarm(cmd.Context(), argv[0])
		},
	}
}

func (a *app) farmListCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the farms' names",
		Example: `  xlb farm list`,
		Args:    args(),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client(cmd)
			if err != nil {
				return err
			}
			names, err := c.ListNames(cmd.Context())
			if err != nil {
				return err
			}
			var buf bytes.Buffer
			for _, n := range names {
				buf.WriteString(n)
				buf.WriteByte('\n')
			}
			_, err = a.out.Write(buf.Bytes())
			return err
		},
	}
}

func (a *app) farmShowCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "show NAME",
		Short: "Show a farm as JSON (every field; the output is a valid PUT /farms body)",
		Example: `  xlb farm show web
  xlb farm show web > web.json`,
		Args: args("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client(cmd)
			if err != nil {
				return err
			}
			raw, err := c.GetFarmJSON(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			var buf bytes.Buffer
			if err := json.Indent(&buf, raw, "", "  "); err != nil {
				return fmt.Errorf("daemon sent bad JSON: %w", err)
			}
			if buf.Len() > 0 && buf.Bytes()[buf.Len()-1] != '\n' {
				buf.WriteByte('\n')
			}
			_, err = a.out.Write(buf.Bytes())
			return err
		},
	}
}
