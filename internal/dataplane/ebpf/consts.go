package ebpf

// Values mirrored from bpf/xlb_consts.h (bpf2go generates types, not macros).
// TestConstsMatchHeader checks them against the header.
const (
	maxServices = 65536
	maxSvcIDs   = 16384
	maxBackends = 262144
	maxSlots    = 1048576
	maxPersist  = 262144

	afInet  = 4
	afInet6 = 6

	modeDNAT = 0
	modeSNAT = 1
	modeDSR  = 2
	modeSTL  = 3

	schedRR      = 0
	schedWeight  = 1
	schedHash    = 2
	schedSymhash = 3
	schedMaglev  = 4

	hashSrcIP   = 1
	hashSrcPort = 2

	beFlagGone   = 1
	beFlagMask   = 0xff
	beSlotShift  = 8
	maxStatSlots = 65536

	svcFlagLog = 1

	ctFwd   = 0
	ctReply = 1

	ctStateSYN   = 0
	ctStateEST   = 1
	ctStateFIN   = 2
	ctStateClose = 3
	ctStateUDP   = 4

	// Verdicts of the program (tcx return codes).
	verdictNext     = -1
	verdictPass     = 0
	verdictDrop     = 2
	verdictRedirect = 7
)

// statNames are the per-CPU counters of xlb_stats, in enum xlb_stat order.
var statNames = []string{
	"rx", "not_parsed", "fragment", "ct_fwd", "ct_reply", "not_vip", "not_syn",
	"new_flow", "no_backend", "snat_full", "ct_race", "peer_repair",
	"fib_redirect", "fib_neigh", "fib_pass", "fib_drop", "error", "ct_expired", "persist_hit", "icmp_nat", "stateless",
	"ct_nodest", "log_lost", "xdp_fwd", "fib_peer",
}

// maxSlotsPerService bounds the weighted slots of one service: weights are
// scaled down (each active backend keeps at least one slot) to fit.
const maxSlotsPerService = 16384

// maxPortsPerFarm bounds how many service keys one farm's virtual ports
// expand to (each port is one xlb_services entry).
const maxPortsPerFarm = 1024
