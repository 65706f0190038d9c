/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Sizes, flags and verdicts of xlb's eBPF data plane. Every size is
 * #ifndef-guarded so a build can override it with -D. The Go side reads the
 * same values through the bindings bpf2go generates from the enums below.
 */
#ifndef XLB_CONSTS_H
#define XLB_CONSTS_H

/* Service keys (VIP, port, protocol) in xlb_services. */
#ifndef XLB_MAX_SERVICES
/* Interfaces whose MAC the XDP program finds by index (xlb_if_mac); one
 * with a higher index is looked up by MAC (xlb_host_mac). */
#ifndef XLB_MAX_IF_MAC
#define XLB_MAX_IF_MAC 4096
#endif

#define XLB_MAX_SERVICES 65536
#endif

/* Service generation ids alive at once (index of xlb_rr): as many as service
 * keys, so the keys, not the ids, bound the farms (16384 once capped a
 * Kubernetes cluster of 10,000 Services with NodePorts). 4 bytes each in
 * xlb_rr and xlb_svc_flags. */
#ifndef XLB_MAX_SVC_IDS
#define XLB_MAX_SVC_IDS 65536
#endif

/* Backend entries over all service generations. */
#ifndef XLB_MAX_BACKENDS
#define XLB_MAX_BACKENDS 262144
#endif

/* Counter slots (xlb_be_stats): backends counted at once. 40 bytes per
 * slot and CPU: 2.5 MiB per CPU. */
#ifndef XLB_MAX_STAT_SLOTS
#define XLB_MAX_STAT_SLOTS 65536
#endif

/* Scheduling slots over all service generations. */
#ifndef XLB_MAX_SLOTS
#define XLB_MAX_SLOTS 1048576
#endif

/* Default conntrack entries (two per connection); the loader sets the real
 * size from Options.ConnTableSize. */
#ifndef XLB_CT_SIZE
#define XLB_CT_SIZE 262144
#endif

/* A conntrack entry refreshes its timestamp, re-checks its peer (the other
 * direction) and re-resolves its cached next hop at most this often. */
#ifndef XLB_CT_REFRESH_NS
#define XLB_CT_REFRESH_NS 1000000000ULL
#endif

/* Source ports tried for a new snat flow before it is dropped. */
/* bpf_fib_lookup() flag BPF_FIB_LOOKUP_MARK (kernel 6.10+; the uapi
 * header this builds with predates it): route by params->mark, which shares
 * the first four bytes of the output-only smac. Older kernels answer
 * -EINVAL, and a marked flow is then passed to the stack. */
#define XLB_FIB_LOOKUP_MARK (1U << 5)

#ifndef XLB_SNAT_TRIES
#define XLB_SNAT_TRIES 8
#endif
#define XLB_SNAT_PORT_MIN 1024

/* Serving backends an lc or wlc farm may have: lc_pick() (xlb_lc.h) looks
 * at each one on every new flow, in a loop the verifier bounds with this. */
#ifndef XLB_LC_MAX_BACKENDS
#define XLB_LC_MAX_BACKENDS 256
#endif

/* Persistence records (client, service) -> backend. */
#ifndef XLB_MAX_PERSIST
#define XLB_MAX_PERSIST 262144
#endif

/* Clients of farms with new-rtlimit or rst-rtlimit whose rate state is
 * kept, (farm, limit, client) entries (xlb_climit.h). LRU: a client evicted
 * starts afresh with a full burst. 24-byte keys and 8-byte values,
 * preallocated. */
#ifndef XLB_MAX_CLIENT_LIMITS
#define XLB_MAX_CLIENT_LIMITS 65536
#endif

/* Static sessions (nftlb's "sessions": a client pinned to a backend by
 * configuration), all farms together. */
#ifndef XLB_MAX_STATIC
#define XLB_MAX_STATIC 65536
#endif

/* Bytes of the connection log ring buffer (xlb_events): 4 MiB holds about
 * 50,000 records; when the reader falls behind, records are lost and
 * counted (log_lost). A power of 2, a multiple of the page size. */
#ifndef XLB_EVENTS_SIZE
#define XLB_EVENTS_SIZE 4194304
#endif

/* Bytes of the connection sync ring buffer (xlb_sync): 4 MiB holds about
 * 43,000 records (96 bytes each with its header), what 4 million a second
 * write between two reads of the daemon (every 10 ms); when it falls
 * behind, records are lost and counted (xlb_sync_lost), and its peers get
 * a full resync. */
#ifndef XLB_SYNC_SIZE
#define XLB_SYNC_SIZE 4194304
#endif

/* Connections a peer's batch hands xlb_ct_install at once (xlb_sync_in). */
#ifndef XLB_SYNC_BATCH
#define XLB_SYNC_BATCH 512
#endif

/* Values shared with Go. They are enums, not #defines, so that bpf2go
 * generates them into internal/dataplane/ebpf/xlb_bpfel.go (-type of each
 * enum; struct xlb_enums below puts them in the object's BTF): the Go side
 * never keeps a copy by hand. The sizes above stay #defines so a build can
 * override them with -D; enum xlb_size passes their values on. */
enum xlb_size {
	XLB_SIZE_SERVICES = XLB_MAX_SERVICES,
	XLB_SIZE_SVC_IDS = XLB_MAX_SVC_IDS,
	XLB_SIZE_BACKENDS = XLB_MAX_BACKENDS,
	XLB_SIZE_STAT_SLOTS = XLB_MAX_STAT_SLOTS,
	XLB_SIZE_SLOTS = XLB_MAX_SLOTS,
	XLB_SIZE_PERSIST = XLB_MAX_PERSIST,
	XLB_SIZE_CLIENT_LIMITS = XLB_MAX_CLIENT_LIMITS,
	XLB_SIZE_STATIC = XLB_MAX_STATIC,
	XLB_SIZE_LC_BACKENDS = XLB_LC_MAX_BACKENDS,
	XLB_SIZE_SYNC_BATCH = XLB_SYNC_BATCH,
};

/* lc/wlc: wlc's weight of serving backend i is in xlb_slots under
 * slot_key.idx XLB_LC_WEIGHT_IDX | i (above any real slot index). */
enum xlb_lc {
	XLB_LC_WEIGHT_IDX = 0x40000000,
};

/* Seed of the hash schedulers: fixed so a restart keeps the mapping; for
 * maglev it is plan.FlowSeed, the nft plane's seed too. */
enum xlb_seed {
	XLB_HASH_SEED = 0x786c6221,
};

/* tcx verdicts (linux/bpf.h of 6.6+; defined here for older headers). */
enum xlb_verdict {
	XLB_NEXT = -1,	  /* TCX_NEXT: not ours, next program / the stack */
	XLB_PASS = 0,	  /* TCX_PASS: to the stack (rewritten or not) */
	XLB_DROP = 2,	  /* TCX_DROP */
	XLB_REDIRECT = 7, /* TCX_REDIRECT */
};

/* Address families in keys. */
enum xlb_af {
	XLB_AF_INET = 4,
	XLB_AF_INET6 = 6,
};

/* struct svc_val.mode */
enum xlb_mode {
	XLB_MODE_DNAT = 0,
	XLB_MODE_SNAT = 1,
	XLB_MODE_DSR =
		2, /* destination MAC only: backends hold the VIP and answer clients directly */
	XLB_MODE_STLSDNAT =
		3, /* dnat without conntrack: each packet scheduled, replies mapped back */
	XLB_MODE_LOCAL =
		4, /* nftlb's local: the node's own sockets serve it, packets pass untouched */
};

/* struct svc_val.sched */
enum xlb_sched {
	XLB_SCHED_RR = 0,      /* round robin over slots, one atomic counter per service */
	XLB_SCHED_WEIGHT = 1,  /* random over weighted slots */
	XLB_SCHED_HASH = 2,    /* xlb_flow_hash_keys of hash_keys over weighted slots */
	XLB_SCHED_SYMHASH = 3, /* jhash of address and/or port pairs, the same both ways */
	XLB_SCHED_MAGLEV = 4,  /* xlb_flow_hash over a Maglev table (plan.Maglev, in Go) */
	XLB_SCHED_LC = 5,      /* fewest active connections (xlb_lc.h) */
	XLB_SCHED_WLC = 6,     /* fewest active connections per unit of weight (xlb_lc.h) */
};

/* struct svc_val.hash_keys */
enum xlb_hash_key {
	XLB_HASH_SRCIP = 1,
	XLB_HASH_SRCPORT = 2,
	XLB_HASH_DSTIP = 4,   /* hash scheduler only */
	XLB_HASH_DSTPORT = 8, /* hash scheduler only */
	XLB_HASH_STATIC =
		128, /* svc_val.persist only: the service has static sessions (xlb_static) */
};

/* struct backend.flags, the low 8 bits of an xlb_be_flags value; the bits
 * above XLB_BE_SLOT_SHIFT are the backend's counter slot in xlb_be_stats
 * (0: not counted). */
enum xlb_be_flag {
	XLB_BE_F_GONE =
		1, /* down or off in its farm: its tracked flows expire (expire_nodest_conn) */
	XLB_BE_F_MASK = 0xff,
	XLB_BE_SLOT_SHIFT = 8,
};

/* xlb_svc_flags value (per service generation id) */
enum xlb_svc_flag {
	XLB_SVC_F_LOG = 1, /* farm log: one xlb_events record per new connection */
	XLB_SVC_F_PASSIVE =
		2, /* passive checks: new TCP flows' handshakes watched (xlb_passive.h) */
	XLB_SVC_F_NOLOCAL =
		4, /* intra-connect off: the node's own sockets are not balanced (xlb_sock.c) */
	/* bits 16-31: the farm's own id, the same in all its generations (0:
	 * none), which keys its clients' rate state (xlb_climit.h) */
	XLB_SVC_FARM_SHIFT = 16,
};

/* struct ct_val.dir */
enum xlb_ct_dir {
	XLB_CT_FWD = 0,	  /* client -> VIP */
	XLB_CT_REPLY = 1, /* backend -> client (or LB snat address) */
};

/* struct ct_val.nh_flags: how to send to the cached next hop */
enum xlb_nh_flag {
	XLB_NH_F_PEER = 1, /* a veth/netkit whose peer is in another namespace (xlb_peer_tx):
			    * bpf_redirect_peer, straight to the peer's ingress */
};

/* struct ct_val.state: where a flow is, which picks its idle timeout
 * (set at load time, see xlb_lb.c; defaults like IPVS's). */
enum xlb_ct_state {
	XLB_CT_STATE_SYN = 0,	/* TCP: SYN seen, handshake not completed */
	XLB_CT_STATE_EST = 1,	/* TCP: established */
	XLB_CT_STATE_FIN = 2,	/* TCP: FIN seen in either direction */
	XLB_CT_STATE_CLOSE = 3, /* TCP: RST seen */
	XLB_CT_STATE_UDP = 4,	/* UDP */
};

/* struct sync_conn.kind: what happened to a flow (the values of Go's
 * dataplane.ConnEventKind). */
enum xlb_sync_kind {
	XLB_SYNC_NEW = 1,
	XLB_SYNC_UPDATE = 2, /* state changed, or still alive (xlb_sync_refresh_ns) */
	XLB_SYNC_END = 3,
	XLB_SYNC_SESSION = 4, /* a persistence session made or refreshed (not a flow) */
};

/* struct sync_conn.rc: what xlb_ct_install did with a peer's connection. */
enum xlb_sync_rc {
	XLB_SYNC_RC_OK = 0, /* installed, updated, or removed */
	XLB_SYNC_RC_UNBOUND =
		1, /* installed, but no farm here has its VIP and backend (yet): carried, not counted */
	XLB_SYNC_RC_MODE = 2,	   /* the service here is dsr or stlsdnat (no state to install) */
	XLB_SYNC_RC_CONFLICT = 3,  /* its tuple or reply tuple is another flow's here */
	XLB_SYNC_RC_GONE = 4,	   /* an end for a flow not here (not an error) */
	XLB_SYNC_RC_ERROR = 5,	   /* map update failed (table full) */
	XLB_SYNC_RC_BAD = 6,	   /* malformed: kind, family or protocol */
	XLB_SYNC_RC_NOPERSIST = 7, /* a session for a service here without persistence */
};

/* Per-CPU counters in xlb_stats. */
enum xlb_stat {
	XLB_STAT_RX = 0,
	XLB_STAT_NOT_PARSED, /* not TCP/UDP over IPv4 or IPv6, malformed, truncated: passed */
	XLB_STAT_FRAGMENT,   /* IPv4 fragment: passed (not balanced) */
	XLB_STAT_CT_FWD,     /* conntrack hit, forward direction */
	XLB_STAT_CT_REPLY,   /* conntrack hit, reply direction */
	XLB_STAT_NOT_VIP,    /* no conntrack, no service: passed */
	XLB_STAT_NOT_SYN,    /* TCP to a VIP without SYN and without conntrack: passed */
	XLB_STAT_NEW_FLOW,   /* new flow scheduled */
	XLB_STAT_NO_BACKEND, /* service without backends: refused (ICMP unreachable; stlsdnat: dropped) */
	XLB_STAT_SNAT_FULL,    /* no free snat source port: dropped */
	XLB_STAT_CT_RACE,      /* another CPU created the same flow first */
	XLB_STAT_PEER_REPAIR,  /* evicted peer entry recreated */
	XLB_STAT_FIB_REDIRECT, /* forwarded with bpf_redirect */
	XLB_STAT_FIB_NEIGH,    /* forwarded with bpf_redirect_neigh */
	XLB_STAT_FIB_PASS,     /* rewritten, handed to the stack (no fib result) */
	XLB_STAT_FIB_DROP,     /* blackhole/unreachable/prohibit route: dropped */
	XLB_STAT_ERROR,	       /* helper failure: dropped */
	XLB_STAT_CT_EXPIRED,   /* conntrack entry idle past its timeout: removed */
	XLB_STAT_PERSIST_HIT,  /* new flow sent to its client's persistent backend */
	XLB_STAT_ICMP_NAT,     /* ICMP error about a tracked flow translated */
	XLB_STAT_STATELESS,    /* stlsdnat packet translated (either direction) */
	XLB_STAT_CT_NODEST, /* tracked flow whose backend is gone: expired (UDP, SYN: rescheduled; else dropped) */
	XLB_STAT_LOG_LOST,    /* connection log record lost: the ring buffer was full */
	XLB_STAT_XDP_FWD,     /* dsr packet forwarded by the XDP fast path */
	XLB_STAT_FIB_PEER,    /* forwarded with bpf_redirect_peer (not counted in fib_redirect) */
	XLB_STAT_POLICY_DROP, /* refused by a farm's policy (xlb_tables.h): dropped */
	XLB_STAT_XDP_POLICY_DROP, /* refused by a farm's policy in the XDP fast path */
	XLB_STAT_RATE_DROP, /* new flow or TCP reset over its client's new-rtlimit or rst-rtlimit (xlb_climit.h): dropped */
	XLB_STAT_OTHER_HOST, /* frame for another host's MAC (flooded, promiscuous): left to the stack */
	XLB_STAT_MAX,
};

/* One field of each enum, so the object's BTF holds them all for bpf2go
 * (xlb_lb.c declares the only variable of this type). */
struct xlb_enums {
	enum xlb_size size;
	enum xlb_seed seed;
	enum xlb_verdict verdict;
	enum xlb_af af;
	enum xlb_mode mode;
	enum xlb_sched sched;
	enum xlb_lc lc;
	enum xlb_hash_key hash_key;
	enum xlb_be_flag be_flag;
	enum xlb_svc_flag svc_flag;
	enum xlb_ct_dir ct_dir;
	enum xlb_nh_flag nh_flag;
	enum xlb_ct_state ct_state;
	enum xlb_sync_kind sync_kind;
	enum xlb_sync_rc sync_rc;
	enum xlb_stat stat;
};

#endif /* XLB_CONSTS_H */
