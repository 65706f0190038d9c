package ebpf

// The C sources live in bpf/ at the repository root. The generated
// xlb_bpfel.go and xlb_bpfel.o are committed, so building needs no clang;
// `go generate ./internal/dataplane/ebpf` (clang, llvm-strip, libbpf-dev)
// rebuilds them.
//go:generate go tool bpf2go -tags linux -target bpfel -type svc_key -type svc_val -type slot_key -type backend -type ct_key -type ct_val -type persist_key -type persist_val -type be_index_key -type stl_key -type stl_val -type be_stats -type conn_event -type br_port_key -type xlb_size -type xlb_seed -type xlb_verdict -type xlb_af -type xlb_mode -type xlb_sched -type xlb_hash_key -type xlb_be_flag -type xlb_svc_flag -type xlb_ct_dir -type xlb_nh_flag -type xlb_ct_state -type xlb_stat -cflags "-O2 -mcpu=v3 -Wall -Werror -I../../../bpf/include" xlb ../../../bpf/xlb_lb.c
