/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Map keys and values. Addresses are 4 x 32 bits so IPv6 fits later; an IPv4
 * address is in [0] and [1..3] are zero. Byte order is noted per field:
 * "net" = network byte order (as in the packet), "host" = CPU order.
 * The Go side uses the bpf2go-generated copies of these (-type), never a
 * hand-kept one.
 */
#ifndef XLB_STRUCTS_H
#define XLB_STRUCTS_H

#include <linux/types.h>

/* Policies of one farm the program checks (xlb_tables.h). */
#ifndef XLB_MAX_FARM_POLICIES
#define XLB_MAX_FARM_POLICIES 8
#endif

/* xlb_services key: a virtual service. */
struct svc_key {
	__u32 addr[4]; /* net: VIP */
	__u16 port;    /* net: virtual port; 0 = every port of the VIP */
	__u8 proto;    /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 family;   /* XLB_AF_INET */
};

/* xlb_services value: the current generation of a service. */
struct svc_val {
	__u32 id;	   /* host: generation id; xlb_rr index, slot_key.svc */
	__u32 slots;	   /* host: number of slots; 0 = no backend: drop new flows */
	__u8 mode;	   /* XLB_MODE_* */
	__u8 sched;	   /* XLB_SCHED_* */
	__u8 hash_keys;	   /* XLB_HASH_* */
	__u8 persist;	   /* XLB_HASH_* of the persistence key; 0 = none */
	__u32 persist_ttl; /* host: persistence timeout in seconds */
	/* new-rtlimit per client (xlb_climit.h): ns between one client's new
	 * flows (the unit's ns / the rate; 0: no limit), and how far ahead of
	 * now its next flow may be booked (iv * (burst - 1)) */
	__u64 new_iv;  /* host */
	__u64 new_tol; /* host */
	/* rst-rtlimit per client: the same for its TCP resets */
	__u64 rst_iv;  /* host */
	__u64 rst_tol; /* host */
	/* The farm's policy tables as tbl_farm_refs() finds them for this
	 * key (xlb_tables.h: tbl_svc_refs), so a packet that looked its
	 * service up needs no second lookup to learn them. Trusted only while
	 * tbl_gen is xlb_tbl_conf's refs generation, which the loader moves
	 * on before it changes any farm's policies; 0 (a value written before
	 * these fields): not known, looked up by key as before. */
	__u16 tbl_ids[XLB_MAX_FARM_POLICIES]; /* host: table ids */
	__u16 tbl_n;			      /* host: ids used */
	__u16 tbl_gen;			      /* host: refs generation; 0: not known */
	__u32 tbl_pad;
};

/* xlb_persist key: a client of a service (the matched service key). */
struct persist_key {
	struct svc_key svc;
	__u32 src[4]; /* net: client address (if XLB_HASH_SRCIP) */
	__u16 sport;  /* net: client port (if XLB_HASH_SRCPORT) */
	__u16 pad;
};

/* xlb_persist value: the backend the client was sent to, by address so it
 * stays valid across service generations. */
struct persist_val {
	__u32 addr[4]; /* net */
	__u16 port;    /* net */
	__u16 pad;
	__u32 pad2;
	__u64 seen; /* host: xlb_now() (CLOCK_MONOTONIC_COARSE ns) of the last new flow */
};

/* xlb_stateless key: a backend of a stlsdnat farm as its replies show it. */
struct stl_key {
	__u32 addr[4]; /* net: backend address */
	__u16 port;    /* net: backend port; 0 = the port the client used */
	__u8 proto;
	__u8 family;
};

/* xlb_stateless value: what the backend's replies are rewritten to. */
struct stl_val {
	__u32 addr[4]; /* net: VIP */
	__u16 port;    /* net: virtual port; 0 = keep the reply's source port */
	__u16 pad;
};

/* xlb_be_index key: a backend of a service generation by address. */
struct be_index_key {
	__u32 svc;     /* host: generation id */
	__u32 addr[4]; /* net */
	__u16 port;    /* net */
	__u16 pad;
};

/* xlb_slots key: slot idx of service generation svc. */
struct slot_key {
	__u32 svc; /* host */
	__u32 idx; /* host: 0 .. svc_val.slots-1 */
};

/* xlb_backends value (key: __u32 backend id, host order). */
struct backend {
	__u32 addr[4]; /* net: real server address */
	__u32 snat[4]; /* net: source address towards it in snat mode */
	__u16 port;    /* net: real server port; 0 = the port the client used */
	__u8 family;   /* XLB_AF_INET */
	__u8 flags;    /* XLB_BE_F_*, as in xlb_be_flags (which the program reads) */
	__u32 mark;    /* host: the backend's mark, set on its flows' packets (0: none) */
};

/* xlb_ct key: a packet's tuple as it arrives at the LB. */
struct ct_key {
	__u32 src[4]; /* net */
	__u32 dst[4]; /* net */
	__u16 sport;  /* net */
	__u16 dport;  /* net */
	__u8 proto;
	__u8 family;
	__u16 pad;
};

/* xlb_ct value: the tuple the packet leaves with. The entry of one direction
 * holds everything needed to rebuild the other's (its "peer"): the peer's key
 * is this value's tuple reversed and its value is this key's tuple reversed.
 */
struct ct_val {
	__u32 src[4];  /* net */
	__u32 dst[4];  /* net */
	__u16 sport;   /* net */
	__u16 dport;   /* net */
	__u8 dir;      /* XLB_CT_FWD or XLB_CT_REPLY */
	__u8 state;    /* XLB_CT_STATE_*: the flow's, kept the same in both entries */
	__u8 mode;     /* XLB_MODE_*; dsr flows have a forward entry only */
	__u8 nh_flags; /* XLB_NH_F_* of the cached next hop (0 in entries of
			* versions before it: plain bpf_redirect) */
	__u32 svc;     /* host: service generation that created the flow */
	__u32 backend; /* host: backend id that was chosen */
	__u64 seen;    /* host: xlb_now() (CLOCK_MONOTONIC_COARSE ns) of the last refresh */
	__u32 ifindex; /* host: cached next hop (0 = none) */
	__u8 smac[6];  /* cached next hop source MAC */
	__u8 dmac[6];  /* cached next hop destination MAC */
	/* host: the flow's mark, set as skb->mark on every packet of both
	 * directions (the nft plane's ct mark): its backend's, else its
	 * client's table value (0: none, the packet's mark is kept) */
	__u32 mark;
	/* the DSCP (0-63) the client's table value gives the flow's forward
	 * packets (set in dir XLB_CT_FWD only, ECN kept; lb_set_dscp); kept in
	 * both entries, as the forward one is rebuilt from the reply one
	 * (ct_refresh). 0: none, the packet's DSCP is kept */
	__u8 dscp;
	__u8 pad[3];
};

/* xlb_br_port key: a bridge and a destination MAC behind it. */
struct br_port_key {
	__u32 bridge; /* ifindex of the bridge (what bpf_fib_lookup answers) */
	__u8 mac[6];  /* the next hop's MAC (bpf_fib_lookup's dmac) */
	__u16 pad;    /* zero */
};

/* xlb_host_mac key: a MAC address of one of this namespace's interfaces. */
struct host_mac_key {
	__u8 mac[6];
	__u16 pad; /* zero */
};

/* xlb_if_mac value: an interface's MAC address. */
struct if_mac {
	__u8 mac[6];
	__u16 set; /* 1: the entry holds the interface's MAC */
};

/* xlb_be_stats value (per CPU; key: __u32 counter slot, host order): what
 * ipvsadm --stats shows per real server. "in" is client -> backend, "out"
 * backend -> client; bytes are the IP packet's (no Ethernet header). */
struct be_stats {
	__u64 conns; /* new connections scheduled to the backend */
	__u64 in_pkts;
	__u64 in_bytes;
	__u64 out_pkts;
	__u64 out_bytes;
};

/* xlb_events record: a new connection of a farm with log set. */
struct conn_event {
	__u32 svc;     /* host: service generation id */
	__u32 backend; /* host: backend id */
	__u32 src[4];  /* net: client address */
	__u32 vip[4];  /* net: address the client connected to */
	__u32 dst[4];  /* net: backend address */
	__u16 sport;   /* net: client port */
	__u16 vport;   /* net: virtual port */
	__u16 dport;   /* net: backend port */
	__u8 proto;
	__u8 family;
	__u64 ts; /* host: bpf_ktime_get_coarse_ns() */
};

/* A connection as nodes of a cluster exchange it (connection sync,
 * xlb_sync.h): an xlb_sync ring buffer record (the program's new, changed
 * and ended flows), and an xlb_sync_in element (a peer's, for
 * xlb_ct_install). The tuple is the forward one as the client sent it and
 * its translation; the wire between nodes is internal/cluster/connsync's.
 * A persistence session (kind XLB_SYNC_SESSION) is one too: client and
 * cport the persist_key's src and sport (zero where the service's
 * persistence does not key on them), vip and vport its service key,
 * backend and bport the persist_val's, reply and rport zero, left the
 * seconds the session has (the service's persist_ttl when it is made). */
struct sync_conn {
	__u32 client[4];  /* net: the client (forward key's source) */
	__u32 vip[4];	  /* net: the address it connected to */
	__u32 backend[4]; /* net: where the flow goes */
	__u32 reply[4];	  /* net: where the backend answers (client, or the snat source) */
	__u16 cport;	  /* net */
	__u16 vport;	  /* net */
	__u16 bport;	  /* net */
	__u16 rport;	  /* net */
	__u8 kind;	  /* XLB_SYNC_NEW, _UPDATE, _END, _SESSION */
	__u8 proto;
	__u8 family;
	__u8 state; /* XLB_CT_STATE_* */
	__u32 left; /* host: xlb_sync_in, and sessions both ways: seconds the entry has
		     * left (0: a whole timeout) */
	__s32 rc;   /* host: xlb_sync_in: set by xlb_ct_install, XLB_SYNC_RC_* */
	__u32 pad;
};

/* xlb_scratch value: per-CPU room for what does not fit the BPF stack. */
struct scratch {
	struct ct_key rk; /* a new flow's reply entry */
	struct ct_val rv;
	__u32 mark; /* the mark the policy check gives the packet's new flow (tbl_check) */
	__u8 dscp;  /* the DSCP it gives the packet's new flow, or a stlsdnat packet (0: none) */
	__u8 pad[3];
};

#endif /* XLB_STRUCTS_H */
