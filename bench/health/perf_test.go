package main

import "testing"

// The classes of a few call chains, as perf script prints them
// (innermost first), from profiles of the half-open checks.
func TestPerfClass(t *testing.T) {
	k := func(s string) string { return "ffffffff81000000 " + s + " ([kernel.kallsyms])" }
	for _, c := range []struct {
		want   string
		frames []string
	}{
		{"user", []string{"a21824 github.com/xlb-lb/xlb/internal/health.(*Monitor).due (/bin/xlb)"}},
		{"lbRecv", []string{"ffffffffc00328b4 bpf_prog_5be5_xlb_syn_rx (bpf_prog_5be5_xlb_syn_rx)", k("tcx_run"), k("__netif_receive_skb_core"), k("br_handle_frame_finish"), k("br_handle_frame"), k("process_backlog"), k("__sys_sendmmsg")}},
		{"bridge", []string{k("__nf_conntrack_find_get"), k("nf_conntrack_in"), k("br_nf_pre_routing"), k("br_handle_frame"), k("process_backlog"), k("__sys_sendmmsg")}},
		{"lbRecv", []string{k("tcp_v4_rcv"), k("ip_local_deliver"), k("ip_rcv"), k("br_handle_frame_finish"), k("br_handle_frame"), k("process_backlog")}},
		{"backends", []string{k("__inet_lookup_established"), k("tcp_v4_rcv"), k("ip_rcv"), k("process_backlog"), k("__sys_sendmmsg")}},
		{"bridge", []string{k("fdb_find_rcu"), k("br_dev_xmit"), k("packet_sendmsg"), k("__sys_sendmmsg")}},
		{"lbKernel", []string{k("packet_sendmsg"), k("__sys_sendmmsg")}},
		{"lbKernel", []string{k("finish_task_switch.isra.0"), k("schedule"), k("futex_do_wait")}},
	} {
		if got := perfClass(c.frames); got != c.want {
			t.Errorf("%v: %s, want %s", c.frames, got, c.want)
		}
	}
}
