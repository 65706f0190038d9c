package ebpf

// The program's constants, from the enums of bpf/xlb_consts.h that bpf2go
// generates into xlb_bpfel.go (-type in gen.go): short names for the Go
// side, typed as the maps' fields hold them. Nothing here is a copy.
const (
	maxServices  = int(xlbXlbSizeXLB_SIZE_SERVICES)
	maxSvcIDs    = uint32(xlbXlbSizeXLB_SIZE_SVC_IDS)
	maxBackends  = uint32(xlbXlbSizeXLB_SIZE_BACKENDS)
	maxSlots     = int(xlbXlbSizeXLB_SIZE_SLOTS)
	maxPersist   = int(xlbXlbSizeXLB_SIZE_PERSIST)
	maxStatSlots = uint32(xlbXlbSizeXLB_SIZE_STAT_SLOTS)

	hashSeed = uint32(xlbXlbSeedXLB_HASH_SEED)

	afInet  = uint8(xlbXlbAfXLB_AF_INET)
	afInet6 = uint8(xlbXlbAfXLB_AF_INET6)

	modeDNAT  = uint8(xlbXlbModeXLB_MODE_DNAT)
	modeSNAT  = uint8(xlbXlbModeXLB_MODE_SNAT)
	modeDSR   = uint8(xlbXlbModeXLB_MODE_DSR)
	modeSTL   = uint8(xlbXlbModeXLB_MODE_STLSDNAT)
	modeLocal = uint8(xlbXlbModeXLB_MODE_LOCAL)

	schedRR      = uint8(xlbXlbSchedXLB_SCHED_RR)
	schedWeight  = uint8(xlbXlbSchedXLB_SCHED_WEIGHT)
	schedHash    = uint8(xlbXlbSchedXLB_SCHED_HASH)
	schedSymhash = uint8(xlbXlbSchedXLB_SCHED_SYMHASH)
	schedMaglev  = uint8(xlbXlbSchedXLB_SCHED_MAGLEV)
	schedLC      = uint8(xlbXlbSchedXLB_SCHED_LC)
	schedWLC     = uint8(xlbXlbSchedXLB_SCHED_WLC)

	// lc/wlc (bpf/xlb_lc.h): the most backends lc_pick looks at, and
	// the slot index bit under which wlc's weights are kept.
	lcMaxBackends = uint32(xlbXlbSizeXLB_SIZE_LC_BACKENDS)
	lcWeightIdx   = uint32(xlbXlbLcXLB_LC_WEIGHT_IDX)

	hashSrcIP   = uint8(xlbXlbHashKeyXLB_HASH_SRCIP)
	hashSrcPort = uint8(xlbXlbHashKeyXLB_HASH_SRCPORT)
	hashDstIP   = uint8(xlbXlbHashKeyXLB_HASH_DSTIP)
	hashDstPort = uint8(xlbXlbHashKeyXLB_HASH_DSTPORT)
	hashStatic  = uint8(xlbXlbHashKeyXLB_HASH_STATIC)

	beFlagGone  = uint8(xlbXlbBeFlagXLB_BE_F_GONE)
	beFlagMask  = uint32(xlbXlbBeFlagXLB_BE_F_MASK)
	beSlotShift = uint32(xlbXlbBeFlagXLB_BE_SLOT_SHIFT)

	svcFlagLog     = uint32(xlbXlbSvcFlagXLB_SVC_F_LOG)
	svcFlagPassive = uint32(xlbXlbSvcFlagXLB_SVC_F_PASSIVE)
	svcFlagNoLocal = uint32(xlbXlbSvcFlagXLB_SVC_F_NOLOCAL)

	ctFwd   = uint8(xlbXlbCtDirXLB_CT_FWD)
	ctReply = uint8(xlbXlbCtDirXLB_CT_REPLY)

	ctStateSYN   = uint8(xlbXlbCtStateXLB_CT_STATE_SYN)
	ctStateEST   = uint8(xlbXlbCtStateXLB_CT_STATE_EST)
	ctStateFIN   = uint8(xlbXlbCtStateXLB_CT_STATE_FIN)
	ctStateClose = uint8(xlbXlbCtStateXLB_CT_STATE_CLOSE)
	ctStateUDP   = uint8(xlbXlbCtStateXLB_CT_STATE_UDP)

	// Verdicts of the program (tcx return codes), as BPF_PROG_TEST_RUN
	// returns them.
	verdictNext     = uint32(xlbXlbVerdictXLB_NEXT)
	verdictPass     = uint32(xlbXlbVerdictXLB_PASS)
	verdictDrop     = uint32(xlbXlbVerdictXLB_DROP)
	verdictRedirect = uint32(xlbXlbVerdictXLB_REDIRECT)
)

// statNames are the per-CPU counters of xlb_stats, in enum xlb_stat order.
var statNames = []string{
	"rx", "not_parsed", "fragment", "ct_fwd", "ct_reply", "not_vip", "not_syn",
	"new_flow", "no_backend", "snat_full", "ct_race", "peer_repair",
	"fib_redirect", "fib_neigh", "fib_pass", "fib_drop", "error", "ct_expired", "persist_hit", "icmp_nat", "stateless",
	"ct_nodest", "log_lost", "xdp_fwd", "fib_peer", "policy_drop", "xdp_policy_drop", "rate_drop",
	"other_host",
}

// maxPortsPerFarm bounds how many service keys one farm's virtual ports
// expand to (each port is one xlb_services entry).
const maxPortsPerFarm = 1024
