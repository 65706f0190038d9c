package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/xlb-lb/xlb/internal/lvs"
)

// importCmd turns LVS configurations into xlb's state file.
func (a *app) importCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "import",
		Short: "Turn an LVS director's configuration into an xlb state file",
		Example: `  xlb import keepalived /etc/keepalived/keepalived.conf -f state.json
  ipvsadm-save -n | xlb import ipvsadm - -f state.json`,
	}
	var file, lcAs string
	ka := &cobra.Command{
		Use:   "keepalived CONFIG [-f FILE]",
		Short: "Turn keepalived.conf's virtual servers and checkers into farms",
		Long: `Read keepalived.conf (and the files it includes) and write its virtual_server
blocks as an xlb state file: each virtual server a farm (lb_algo, lb_kind,
protocol, persistence_timeout, quorum, hysteresis, sorry_server), each real
server a backend (weight, uthreshold) with its checker as the backend's check
(TCP_CHECK, HTTP_GET, SSL_GET, MISC_CHECK, UDP_CHECK, with keepalived's timing:
delay_loop, connect_timeout, retry, delay_before_retry, alpha). What xlb cannot
do as keepalived and IPVS would is refused with the file and line; settings
without an effect in xlb (notify scripts, mail alerts, VRRP) are listed on
stderr. The daemon is not contacted: review the file, then "xlb restore" it.
VRRP stays keepalived's (docs/lvs-import.md).`,
		Example: `  xlb import keepalived /etc/keepalived/keepalived.conf -f state.json
  xlb restore -f state.json`,
		Args: args("CONFIG"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			nodes, err := lvs.ParseKeepalivedFile(argv[0])
			if err != nil {
				return err
			}
			res, err := lvs.ConvertKeepalived(nodes)
			if err != nil {
				return err
			}
			return a.writeImport(res, file, lcAs)
		},
	}
	ka.Flags().StringVarP(&file, "file", "f", "", "state file to write (default: stdout)")
	ka.Flags().StringVar(&lcAs, "lc-as", "", "replace lc and wlc (keepalived's default) by this IPVS scheduler, e.g. wrr: the nft data plane does not build them")
	ipvs := &cobra.Command{
		Use:   "ipvsadm RULES|- [-f FILE]",
		Short: "Turn ipvsadm-save's rules into farms",
		Long: `Read ipvsadm's rules as "ipvsadm-save -n" writes them (a file, or - for stdin)
and write them as an xlb state file: each service (-A: -t, -u, --sctp-service,
-f; -s, -p, -M, -o) a farm, each real server (-a: -r, -g, -m, -w, -x) a backend,
with ipvsadm's defaults (scheduler wlc, persistence 300 s, gatewaying). What xlb
cannot do as IPVS would is refused with the line. The daemon is not contacted:
review the file, then "xlb restore" it (docs/lvs-import.md).`,
		Example: `  ipvsadm-save -n | xlb import ipvsadm - -f state.json
  xlb import ipvsadm /etc/ipvsadm.rules -f state.json && xlb restore -f state.json`,
		Args: args("RULES"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			in, name := io.Reader(a.in), "stdin"
			if argv[0] != "-" {
				f, err := os.Open(argv[0])
				if err != nil {
					return fmt.Errorf("read ipvsadm rules: %w", err)
				}
				defer f.Close()
				in, name = f, argv[0]
			}
			res, err := lvs.ConvertIPVSAdm(in, name)
			if err != nil {
				return err
			}
			return a.writeImport(res, file, lcAs)
		},
	}
	ipvs.Flags().StringVarP(&file, "file", "f", "", "state file to write (default: stdout)")
	ipvs.Flags().StringVar(&lcAs, "lc-as", "", "replace lc and wlc (ipvsadm's default) by this IPVS scheduler, e.g. wrr: the nft data plane does not build them")
	cmd.AddCommand(ka, ipvs)
	return cmd
}

// writeImport writes an import's notes to stderr and its farms as a state
// file ("xlb restore" takes it) to file, or stdout, lc and wlc replaced by
// lcAs if given.
func (a *app) writeImport(res *lvs.Result, file, lcAs string) error {
	if err := res.ReplaceLeastConn(lcAs); err != nil {
		return err
	}
	for _, n := range res.Notes {
		fmt.Fprintln(a.errOut, "note:", n)
	}
	write := func(w io.Writer) error {
		b := []byte(`{"farms":[`)
		for i := range res.Farms {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '\n')
			b = res.Farms[i].AppendJSON(b)
		}
		b = append(b, "\n]}\n"...)
		_, err := w.Write(b)
		return err
	}
	if file == "" || file == "-" {
		return write(a.out)
	}
	return writeFileAtomic(file, write)
}
