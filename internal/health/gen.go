package health

// The half-open checks' receive program (bpf/xlb_synprobe.c, see
// synbypass.go). The generated synprobe_bpfel.go and .o are committed, as
// the eBPF plane's are.
//go:generate go tool bpf2go -tags linux -target bpfel -type syn_reply -cflags "-O2 -mcpu=v3 -Wall -Werror -I../../bpf/include" synprobe ../../bpf/xlb_synprobe.c
