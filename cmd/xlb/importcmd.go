package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/xlb-lb/xlb/internal/keepalived"
)

// importCmd turns other balancers' configurations into xlb's state file.
func (a *app) importCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "import",
		Short:   "Turn another balancer's configuration into an xlb state file",
		Example: `  xlb import keepalived /etc/keepalived/keepalived.conf -f state.json`,
	}
	var file string
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
VRRP stays keepalived's (docs/keepalived-import.md).`,
		Example: `  xlb import keepalived /etc/keepalived/keepalived.conf -f state.json
  xlb restore -f state.json`,
		Args: args("CONFIG"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			nodes, err := keepalived.ParseFile(argv[0])
			if err != nil {
				return err
			}
			res, err := keepalived.Convert(nodes)
			if err != nil {
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
		},
	}
	ka.Flags().StringVarP(&file, "file", "f", "", "state file to write (default: stdout)")
	cmd.AddCommand(ka)
	return cmd
}
