package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/xlb-lb/xlb/internal/client"
	"github.com/xlb-lb/xlb/internal/model"
)

// The table command speaks ipfw's table syntax ("ipfw table NAME add ...")
// and sends everything through the API like every other command.

const tableUsage = `table create NAME [type addr|number|iface|mac|flow:FIELDS] [valtype FIELDS] [limit N] [locked]
                 [timeout SECONDS] [family ipv4|ipv6|dual] [verdict deny|allow]
  table NAME add [--atomic] [--update] [--timeout S] ENTRY [VALUE] [ENTRY [VALUE]]... | -f FILE
  table NAME delete [--atomic] ENTRY... | -f FILE
  table NAME list | info | detail | counters | flush | destroy | lock | unlock
  table NAME lookup KEY
  table NAME modify limit N | timeout S | verdict V | ...
  table swap A B
  table list`

type tableOptions struct {
	atomic, update bool
	file           string
	timeout        int
}

func (a *app) tableCmd() *cobra.Command {
	var o tableOptions
	cmd := &cobra.Command{
		Use:   tableUsage,
		Short: "Named tables (ipfw's lookup tables; nftlb's policies are tables with a verdict)",
		Long: `Named tables as FreeBSD ipfw has them. Keys: addr (IPv4/IPv6 addresses and
prefixes; a lookup answers the most specific), number (32-bit), iface, mac, or
flow:FIELDS over src-ip,proto,src-port,dst-ip,dst-port. Values (valtype): mark,
farm, backend, limit, dscp, tag; an entry's value is written name=value,... or,
as ipfw does, the values alone in valtype order ("16,web").

A batch of entries (add or delete, several ENTRY arguments or -f FILE, "-" for
stdin, one "KEY [VALUE] [timeout SECONDS]" a line) reports each entry that fails
and adds the others, like ipfw; --atomic makes it all or nothing. A table with a
verdict (deny or allow) is a policy farms can attach ("policies" in the farm's
JSON, or POST /farms/NAME/policies): an addr table matches the client's address,
number its source port, iface the ingress interface, mac its source MAC, flow
its fields. An addr table whose valtype has limit or mark can be attached
without a verdict: the most specific entry's limit (new connections a second)
and mark apply. A table with values takes ENTRY VALUE pairs on the command line.`,
		Example: `  xlb table create bad type addr verdict deny
  xlb table bad add 192.0.2.0/24 198.51.100.7
  xlb table create marks type addr valtype mark,farm limit 100000
  xlb table marks add 10.0.0.0/8 16,web 10.1.0.0/16 mark=17,farm=api
  xlb table marks add --atomic -f prefixes.txt
  xlb table marks lookup 10.1.2.3
  xlb table swap marks marks-next
  xlb table marks lock
  xlb table create ports type number verdict deny
  xlb table ports add 6667 31337
  xlb table create rates type addr valtype limit
  xlb table rates add 10.0.0.0/8 100 10.1.2.3 0`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client(cmd)
			if err != nil {
				return err
			}
			return a.table(cmd, c, o, args)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&o.atomic, "atomic", false, "add/delete: all entries or none")
	f.BoolVar(&o.update, "update", false, "add: replace the value of entries that exist instead of failing them")
	f.StringVarP(&o.file, "file", "f", "", "add/delete: read entries from FILE, one a line ('-': standard input)")
	f.IntVar(&o.timeout, "timeout", -1, "add: seconds the entries live (0: never; default: the table's timeout)")
	return cmd
}

func (a *app) table(cmd *cobra.Command, c *client.Client, o tableOptions, args []string) error {
	ctx := cmd.Context()
	switch args[0] {
	case "create":
		if len(args) < 2 {
			return fmt.Errorf("usage: xlb table create NAME [type ...] [valtype ...] [limit N] [locked]")
		}
		body, err := tableSpecBody(args[1], args[2:], true)
		if err != nil {
			return err
		}
		return c.CreateTable(ctx, body)
	case "swap":
		if len(args) != 3 {
			return fmt.Errorf("usage: xlb table swap A B")
		}
		return c.SwapTables(ctx, args[1], args[2])
	case "list":
		if len(args) == 1 {
			ts, err := c.Tables(ctx)
			if err != nil {
				return err
			}
			for _, t := range ts {
				printTableInfo(a.out, t, false)
			}
			return nil
		}
	}
	if len(args) < 2 {
		return fmt.Errorf("usage: xlb %s", tableUsage)
	}
	name, verb, rest := args[0], args[1], args[2:]
	noArgs := func() error {
		if len(rest) > 0 {
			return fmt.Errorf("xlb table %s %s takes no arguments (got %q)", name, verb, strings.Join(rest, " "))
		}
		return nil
	}
	switch verb {
	case "create": // ipfw's order: table NAME create ...
		body, err := tableSpecBody(name, rest, true)
		if err != nil {
			return err
		}
		return c.CreateTable(ctx, body)
	case "modify":
		body, err := tableSpecBody(name, rest, false)
		if err != nil {
			return err
		}
		return c.PutTable(ctx, name, body)
	case "lock", "unlock":
		if err := noArgs(); err != nil {
			return err
		}
		return c.PutTable(ctx, name, []byte(fmt.Sprintf(`{"locked":"%v"}`, verb == "lock")))
	case "flush":
		if err := noArgs(); err != nil {
			return err
		}
		return c.FlushTable(ctx, name)
	case "destroy":
		if err := noArgs(); err != nil {
			return err
		}
		return c.DestroyTable(ctx, name)
	case "info", "detail":
		if err := noArgs(); err != nil {
			return err
		}
		t, err := c.Table(ctx, name, verb == "detail")
		if err != nil {
			return err
		}
		printTableInfo(a.out, t, verb == "detail")
		return nil
	case "list":
		if err := noArgs(); err != nil {
			return err
		}
		t, err := c.Table(ctx, name, false)
		if err != nil {
			return err
		}
		fmt.Fprintf(a.out, "--- table(%s), type %s, %s entries ---\n", t.Name, t.Type, t.Count)
		return c.ListEntries(ctx, name, a.out)
	case "counters":
		if err := noArgs(); err != nil {
			return err
		}
		cs, err := c.TableCounters(ctx, name)
		if err != nil {
			return err
		}
		fmt.Fprintf(a.out, "--- table(%s) counters: %d entries matched ---\n", cs.Name, len(cs.Entries))
		for _, e := range cs.Entries {
			fmt.Fprintf(a.out, "%s %s packets %s bytes\n", e.Key, e.Packets, e.Bytes)
		}
		return nil
	case "lookup":
		if len(rest) != 1 {
			return fmt.Errorf("usage: xlb table %s lookup KEY", name)
		}
		raw, err := c.Lookup(ctx, name, rest[0])
		if err != nil {
			return err
		}
		return printEntry(a.out, raw)
	case "add", "delete":
		lines, err := a.entryLines(cmd, c, name, verb, rest, o)
		if err != nil {
			return err
		}
		res, err := c.EntryBatch(ctx, name, bytes.NewReader(lines), verb == "delete", model.BatchOptions{Atomic: o.atomic, Update: o.update})
		if err != nil {
			return err
		}
		for _, e := range res.Errors {
			fmt.Fprintf(a.errOut, "xlb: %s\n", e.Error)
		}
		past := map[string]string{"add": "added", "delete": "deleted"}[verb]
		if res.Failed > len(res.Errors) {
			fmt.Fprintf(a.errOut, "xlb: ... and %d more failures\n", res.Failed-len(res.Errors))
		}
		fmt.Fprintf(a.out, "%s %d entries of table %s", past, res.Done, name)
		if res.Failed > 0 {
			fmt.Fprintf(a.out, ", %d failed", res.Failed)
		}
		fmt.Fprintln(a.out)
		if res.Failed > 0 {
			return fmt.Errorf("%d of %d entries failed", res.Failed, res.Done+res.Failed)
		}
		return nil
	}
	return fmt.Errorf("unknown table command %q; usage: xlb %s", verb, tableUsage)
}

// tableSpecBody turns ipfw's words (type addr valtype mark limit 10
// locked) into a table's JSON. With create every keyword is allowed;
// modify takes those that may change.
func tableSpecBody(name string, words []string, create bool) ([]byte, error) {
	spec := map[string]string{"name": name}
	keys := map[string]string{"type": "type", "valtype": "valtype", "limit": "limit", "timeout": "timeout",
		"family": "family", "verdict": "verdict", "log-prefix": "log-prefix", "priority": "priority"}
	for i := 0; i < len(words); i++ {
		w := words[i]
		if w == "locked" && create {
			spec["locked"] = "true"
			continue
		}
		key, ok := keys[w]
		if !ok || !create && (key == "type" || key == "valtype" || key == "family") {
			return nil, fmt.Errorf("table %q: unknown or unchangeable keyword %q; %s", name, w, tableUsage)
		}
		if i+1 >= len(words) {
			return nil, fmt.Errorf("table %q: %s needs a value", name, w)
		}
		spec[key] = words[i+1]
		i++
	}
	return json.Marshal(spec)
}

// entryLines builds the batch: from -f FILE, or from the arguments
// (ENTRY VALUE pairs for tables with values, the last VALUE optional;
// keys otherwise).
func (a *app) entryLines(cmd *cobra.Command, c *client.Client, name, verb string, args []string, o tableOptions) ([]byte, error) {
	suffix := ""
	if o.timeout >= 0 {
		suffix = " timeout " + strconv.Itoa(o.timeout)
	}
	if o.file != "" {
		if len(args) > 0 {
			return nil, fmt.Errorf("give entries as arguments or with -f, not both")
		}
		var r io.Reader = a.in
		if o.file != "-" {
			f, err := os.Open(o.file)
			if err != nil {
				return nil, fmt.Errorf("read entries: %w", err)
			}
			defer f.Close()
			r = f
		}
		if suffix == "" {
			return io.ReadAll(r)
		}
		var b bytes.Buffer
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if l := strings.TrimSpace(sc.Text()); l != "" && l[0] != '#' {
				b.WriteString(l + suffix + "\n")
			}
		}
		return b.Bytes(), sc.Err()
	}
	if len(args) == 0 {
		return nil, fmt.Errorf("usage: xlb table %s %s ENTRY [VALUE]... | -f FILE", name, verb)
	}
	withValues := false
	if verb == "add" {
		t, err := c.Table(cmd.Context(), name, false)
		if err != nil {
			return nil, err
		}
		withValues = t.Valtype != ""
	}
	var b bytes.Buffer
	for i := 0; i < len(args); i++ {
		b.WriteString(args[i])
		if withValues && i+1 < len(args) {
			b.WriteString(" " + args[i+1])
			i++
		}
		b.WriteString(suffix + "\n")
	}
	return b.Bytes(), nil
}

func printTableInfo(w io.Writer, t client.TableInfo, detail bool) {
	fmt.Fprintf(w, "--- table(%s) ---\n", t.Name)
	fmt.Fprintf(w, " kindex: type %s, family %s, valtype %s\n", t.Type, t.Family, orNone(t.Valtype))
	fmt.Fprintf(w, " references: %s, verdict %s\n", lockWord(t.Locked), t.Verdict)
	fmt.Fprintf(w, " items: %s, limit: %s, timeout: %s\n", t.Count, orNone(zeroNone(t.Limit)), orNone(zeroNone(t.Timeout)))
	if detail {
		fmt.Fprintf(w, " algorithm: %s\n memory: %s bytes (estimated, daemon)\n users: %s\n", t.Algorithm, t.Memory, orNone(strings.Join(t.Users, ",")))
	}
}

func lockWord(locked string) string {
	if locked == "true" {
		return "locked"
	}
	return "unlocked"
}

func zeroNone(s string) string {
	if s == "0" {
		return ""
	}
	return s
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func printEntry(w io.Writer, raw []byte) error {
	var e struct {
		Key     string            `json:"key"`
		Value   map[string]string `json:"value"`
		Expires string            `json:"expires"`
	}
	if err := json.Unmarshal(raw, &e); err != nil {
		return fmt.Errorf("decode the daemon's answer: %w", err)
	}
	fmt.Fprint(w, e.Key)
	if len(e.Value) > 0 {
		var parts []string
		for _, f := range []string{"mark", "farm", "backend", "limit", "dscp", "tag"} {
			if v, ok := e.Value[f]; ok {
				parts = append(parts, f+"="+v)
			}
		}
		fmt.Fprint(w, " "+strings.Join(parts, ","))
	}
	if e.Expires != "" {
		fmt.Fprint(w, " expires "+e.Expires)
	}
	fmt.Fprintln(w)
	return nil
}
