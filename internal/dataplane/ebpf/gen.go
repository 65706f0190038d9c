package ebpf

// The C sources live in bpf/ at the repository root. The generated
// xlb_bpfel.go and xlb_bpfel.o are committed, so building needs no clang;
// `go generate ./internal/dataplane/ebpf` (clang, llvm-strip, libbpf-dev)
// rebuilds them.
//go:generate go tool bpf2go -tags linux -target bpfel -type svc_key -type svc_val -type slot_key -type backend -type ct_key -type ct_val -type persist_key -type persist_val -type be_index_key -type stl_key -type stl_val -type be_stats -type conn_event -type sync_conn -type sync_args -type br_port_key -type host_mac_key -type if_mac -type passive_be -type passive_syn -type xlb_size -type xlb_seed -type xlb_verdict -type xlb_af -type xlb_mode -type xlb_sched -type xlb_lc -type xlb_hash_key -type xlb_be_flag -type xlb_svc_flag -type xlb_ct_dir -type xlb_nh_flag -type xlb_ct_state -type xlb_sync_kind -type xlb_sync_rc -type xlb_stat -type tbl_key4 -type tbl_key6 -type tbl_hkey -type tbl_val -type tbl_policy -type tbl_steer -type tbl_bind -type tbl_event -type xlb_tbl_type -type xlb_tbl_size -type xlb_tbl_verdict -type xlb_tbl_conf_flag -cflags "-O2 -mcpu=v3 -Wall -Werror -I../../../bpf/include" xlb ../../../bpf/xlb_lb.c

// The socket programs (bpf/xlb_sock.c): their own object, loaded only when
// socket-level balancing is on, sharing the maps above (socklb.go).
//go:generate go tool bpf2go -tags linux -target bpfel -type sock_rev_key -type sock_rev_val -type sock_fwd_key -type sock_fwd_val -type xlb_sock_stat -cflags "-O2 -mcpu=v3 -Wall -Werror -I../../../bpf/include" xlbSock ../../../bpf/xlb_sock.c
