/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Named tables (ipfw's lookup tables) and farms' policies (nftlb's
 * blacklists and whitelists). See docs/tables.md.
 *
 * A table's entries live in a storage *slot*: one LPM trie per address
 * family, made by the loader and held at the slot's index in
 * xlb_tbl_addr4/6 (arrays of maps). A table id is bound to its slot by its
 * entry in xlb_tbl_meta, a plain array: a swap of two tables rewrites two
 * such entries (one batch syscall), whatever the tables' sizes, and a
 * packet sees a table's old entries or its new ones, never a mix or an
 * empty table. (Not an update of the arrays of maps: the kernel waits for
 * an RCU grace period, milliseconds, after each update of one.)
 *
 * A farm's policies are found by the packet's destination (VIP, protocol,
 * port; port 0 for farms of every port) in xlb_tbl_policy, apart from the
 * services: every packet to the farm is checked, not only a connection's
 * first (as the nft plane does), and a farm changed or rebuilt keeps its
 * policies in place. Packets pay for the lookup only while some farm has
 * policies (xlb_tbl_conf).
 */
#ifndef XLB_TABLES_H
#define XLB_TABLES_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "xlb_consts.h"
#include "xlb_structs.h"
#include "xlb_parsing.h"
#include "xlb_maps.h" /* xlb_events */
#include "xlb_pick.h" /* stat_inc */
#include "xlb_rate.h"

/* Table ids are 1-65535 (model.MaxTables), and so are slot indices (a
 * table has one slot at a time); index 0 is never used. */
#ifndef XLB_MAX_TABLES
#define XLB_MAX_TABLES 65536
#endif

/* Entries of one table (model.MaxTableEntries). The tries are not
 * preallocated: this bounds them, it costs nothing. */
#ifndef XLB_MAX_TABLE_ENTRIES
#define XLB_MAX_TABLE_ENTRIES 16777216
#endif

/* Service keys (VIP, protocol, port) of farms with policies. */
#ifndef XLB_MAX_POLICY_KEYS
#define XLB_MAX_POLICY_KEYS 65536
#endif

/* Entries of each CPU's copy of xlb_tbl_policy (tbl_farm_refs), a power
 * of two. */
#ifndef XLB_TBL_PCACHE_SIZE
#define XLB_TBL_PCACHE_SIZE 4096
#endif

/* Farms chosen by source table on one VIP, protocol and port (the default
 * farm, without a source table, not counted). */
#ifndef XLB_MAX_SOURCE_FARMS
#define XLB_MAX_SOURCE_FARMS 8
#endif

/* Values shared with Go (bpf2go -type; struct xlb_tbl_enums puts them in
 * the object's BTF). */
enum xlb_tbl_size {
	XLB_TBL_SIZE_TABLES = XLB_MAX_TABLES,
	XLB_TBL_SIZE_ENTRIES = XLB_MAX_TABLE_ENTRIES,
	XLB_TBL_SIZE_FARM_POLICIES = XLB_MAX_FARM_POLICIES,
	XLB_TBL_SIZE_POLICY_KEYS = XLB_MAX_POLICY_KEYS,
	XLB_TBL_SIZE_SOURCE_FARMS = XLB_MAX_SOURCE_FARMS,
	XLB_TBL_SIZE_PCACHE = XLB_TBL_PCACHE_SIZE,
	/* A farm chosen by source table has its services in xlb_services
	 * under its key with a tag (1-31) in svc_key.family's bits 3-7. */
	XLB_TBL_SIZE_SVC_TAG_SHIFT = 3,
};

/* xlb_tbl_meta value: what a farm does with a client found in the table
 * (model.ListVerdict), in the low byte of tbl_bind.verdict; flags above. */
enum xlb_tbl_verdict {
	XLB_TBL_NONE = 0,	     /* not a policy */
	XLB_TBL_DENY = 1,	     /* blacklist: a match drops */
	XLB_TBL_ALLOW = 2,	     /* whitelist: no match drops */
	XLB_TBL_VERDICT_MASK = 0xff, /* the verdict's bits */
	XLB_TBL_F_LOG = 0x100,	     /* the table has a log-prefix: its drops go to xlb_events */
	XLB_TBL_F_LIMIT = 0x200,     /* the table's valtype has limit: matches are rate limited */
	XLB_TBL_F_MARK = 0x400, /* the table's valtype has mark: matches mark their new flows */
	XLB_TBL_F_DSCP = 0x800, /* the table's valtype has dscp: matches set their flows' DSCP */
	XLB_TBL_T_SHIFT = 12,	/* bits 12-15: the table's type (XLB_TBL_T_*) */
	XLB_TBL_FF_SHIFT = 16,	/* bits 16-20: a flow table's fields (model.FlowFields) */
};

/* Table types as the program holds them. */
enum xlb_tbl_type {
	XLB_TBL_T_ADDR = 0,   /* LPM tries in xlb_tbl_addr4/6 */
	XLB_TBL_T_NUMBER = 1, /* hash in xlb_tbl_hash: the client's port (tbl_hkey.sport) */
	XLB_TBL_T_MAC = 2,    /* hash in xlb_tbl_hash: the client's Ethernet address */
	XLB_TBL_T_FLOW = 3,   /* hash in xlb_tbl_hash: the flow fields the table has */
	XLB_TBL_T_IFACE = 4,  /* hash in xlb_tbl_hash: the index of the interface the packet came
			       * in on (tbl_hkey.ifindex; the loader resolves names to indexes) */
	XLB_TBL_FF_SRC_IP = 1,
	XLB_TBL_FF_PROTO = 2,
	XLB_TBL_FF_SRC_PORT = 4,
	XLB_TBL_FF_DST_IP = 8,
	XLB_TBL_FF_DST_PORT = 16,
};

/* xlb_tbl_conf value: which policy lookups a packet needs (low bits), and
 * the policy generation (bits XLB_TBL_GEN_SHIFT on; see tbl_check). */
enum xlb_tbl_conf_flag {
	XLB_TBL_CONF_PORT = 1,	  /* some farm of given ports has policies */
	XLB_TBL_CONF_ANYPORT = 2, /* some farm of every port (port 0) has policies */
	XLB_TBL_CONF_ANY = 3,
	XLB_TBL_CONF_MAC = 4,	       /* some farm has a mac table: load the source MAC */
	XLB_TBL_CONF_STEER = 8,	       /* some key is shared by farms chosen by source table */
	XLB_TBL_CONF_XDP = 0x40000000, /* never stored: tbl_denied runs in the XDP program */
	XLB_TBL_GEN_SHIFT = 8,
	XLB_TBL_GEN_MAX = 127, /* generations 1-127 fit a conntrack entry's nh_flags */
	/* bits 16-29: the refs generation, under which a service's value
	 * carries its farm's policy ids (svc_val.tbl_gen; 0: none trusted) */
	XLB_TBL_REFS_SHIFT = 16,
	XLB_TBL_REFS_MAX = 0x3fff,
	/* ct_val.nh_flags bits 1-7: the generation under which the entry's
	 * tuple last passed its farm's policies (0: not known). */
	XLB_TBL_NH_GEN_SHIFT = 1,
	XLB_TBL_NH_GEN_MASK = 0xfe,
};

/* Inner map keys: an LPM trie key is a prefix length then the address. */
struct tbl_key4 {
	__u32 prefixlen; /* host */
	__u32 addr;	 /* net */
};

struct tbl_key6 {
	__u32 prefixlen; /* host */
	__u32 addr[4];	 /* net */
};

/* Inner map value: an entry's counters, the value fields the program
 * uses (model.TableValue: mark, limit, dscp) and the entry's rate-limit
 * state. dscp came after the others (40 bytes, 32 before it): a pinned
 * array of tries made by an older version is replaced at start
 * (replaceStaleTables).
 * The counters are shared by all CPUs (an LPM trie has no per-CPU flavour)
 * and added atomically on a match; the loader keeps them when it replaces
 * an entry's value. */
struct tbl_val {
	__u64 packets; /* host */
	__u64 bytes;   /* host: IP bytes */
	__u32 mark;    /* host: the mark of the new flows of the entry's clients; 0: none */
	__u32 limit;   /* host: new connections per second from the entry's clients; 0: none */
	__u64 tat; /* host: GCRA's theoretical arrival time (bpf_ktime_get_ns), see tbl_limited */
	__u8 dscp; /* the DSCP (0-63) of the packets of the entry's clients; 0: kept */
	__u8 pad[7];
};

/* Inner map key of a number, mac or flow table: the fields its type uses,
 * the others zero. */
struct tbl_hkey {
	union {
		__u32 src[4];  /* net: flow src-ip */
		__u32 ifindex; /* host: an iface table's interface index */
	};
	__u32 dst[4]; /* net: flow dst-ip */
	__u16 sport;  /* net: flow src-port, or a number table's port */
	__u16 dport;  /* net: flow dst-port */
	__u8 proto;   /* flow proto */
	__u8 family;  /* XLB_AF_* of a flow with an address, else 0 */
	__u8 mac[6];  /* a mac table's Ethernet address */
};

/* What a policy check knows of a packet besides its headers (struct pkt):
 * the source Ethernet address (zeros where not loaded or none: a socket),
 * the interface it came in on (0: none, a socket) and the service it was
 * found to go to (NULL: not looked up, or none; tbl_svc_refs). */
struct tbl_in {
	__u8 smac[6];
	__u8 xdp; /* 1 in the XDP program: a pass is not counted, tcx counts it */
	__u8 pad;
	__u32 ifindex;
	const struct svc_val *svc;
};

/* xlb_tbl_meta value: a table id's slot and verdict. */
struct tbl_bind {
	__u32 slot;    /* host: index in xlb_tbl_addr4/6; 0 = not bound */
	__u32 verdict; /* host: XLB_TBL_*: the table's own, which a swap leaves */
};

/* xlb_tbl_policy value: a farm's policy tables, in the order they are
 * checked (priority, then name). */
struct tbl_policy {
	__u16 ids[XLB_MAX_FARM_POLICIES]; /* host: table ids */
	__u32 n;			  /* host: ids used */
	/* net: the node's own address towards the farm's VIP (a route lookup
	 * when the policies were written): the source the socket programs
	 * check an unbound socket's connection with (xlb_sock.c); zero:
	 * none found */
	__u32 node_src[4];
};

/* The ids of a farm's policy tables as the packet path checks them (a copy
 * of struct tbl_policy's, on the stack; their number apart). */
struct tbl_refs {
	__u16 ids[XLB_MAX_FARM_POLICIES]; /* host: table ids */
};

/* xlb_tbl_pcache value: one CPU's copy of the xlb_tbl_policy entry of one
 * service key, or of its absence (see tbl_key_refs). */
struct tbl_pcache {
	__u32 seq; /* odd while this CPU writes it (a nested run skips it) */
	__u32 gen; /* the policy generation it was read under; 0: empty */
	struct svc_key key;
	struct tbl_refs refs;
	__s32 n; /* ids in refs; -1: the key has no policies */
};

/* xlb_events record of a packet a farm's policy dropped (table with a
 * log-prefix). It shares the ring buffer with struct conn_event and is
 * told apart by its size (56 bytes, conn_event's is 80). */
struct tbl_event {
	__u32 src[4]; /* net: client address */
	__u32 dst[4]; /* net: VIP */
	__u64 ts;     /* host: bpf_ktime_get_coarse_ns() */
	__u16 id;     /* host: the table whose verdict dropped the packet */
	__u16 sport;  /* net */
	__u16 dport;  /* net */
	__u8 proto;
	__u8 family;
	__u8 verdict; /* XLB_TBL_DENY (a match) or XLB_TBL_ALLOW (no match) */
	__u8 xdp;     /* 1: dropped in the XDP program */
	__u8 pad[6];
};

struct tbl_enums {
	enum xlb_tbl_type type;
	enum xlb_tbl_size size;
	enum xlb_tbl_verdict verdict;
	enum xlb_tbl_conf_flag conf;
};

/* Never read: puts the enums and structs into the BTF for bpf2go. */
const struct tbl_enums *xlb_tbl_enums_btf __attribute__((unused));
const struct tbl_val *xlb_unused_tbl_val __attribute__((unused));
const struct tbl_key4 *xlb_unused_tbl_key4 __attribute__((unused));
const struct tbl_key6 *xlb_unused_tbl_key6 __attribute__((unused));
const struct tbl_hkey *xlb_unused_tbl_hkey __attribute__((unused));
const struct tbl_bind *xlb_unused_tbl_bind __attribute__((unused));
const struct tbl_event *xlb_unused_tbl_event __attribute__((unused));
const struct tbl_steer *xlb_unused_tbl_steer __attribute__((unused));
const struct tbl_pcache *xlb_unused_tbl_pcache __attribute__((unused));

/* The inner maps' template: the loader makes one trie per slot and family
 * like these (named xt4_<slot>, xt6_<slot>, so a restarted loader knows
 * which slot a bound trie is). */
struct tbl_lpm4 {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct tbl_key4);
	__type(value, struct tbl_val);
	__uint(max_entries, XLB_MAX_TABLE_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
};

struct tbl_lpm6 {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct tbl_key6);
	__type(value, struct tbl_val);
	__uint(max_entries, XLB_MAX_TABLE_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
};

struct tbl_hash {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct tbl_hkey);
	__type(value, struct tbl_val);
	__uint(max_entries, XLB_MAX_TABLE_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
};

/* slot index -> the slot's hash (number, mac and flow tables; the loader
 * names it xh_<slot>). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, XLB_MAX_TABLES);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct tbl_hash);
} xlb_tbl_hash SEC(".maps");

/* slot index -> the slot's IPv4 trie. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, XLB_MAX_TABLES);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct tbl_lpm4);
} xlb_tbl_addr4 SEC(".maps");

/* slot index -> the slot's IPv6 trie. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, XLB_MAX_TABLES);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct tbl_lpm6);
} xlb_tbl_addr6 SEC(".maps");

/* table id -> its slot and verdict. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct tbl_bind);
	__uint(max_entries, XLB_MAX_TABLES);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_tbl_meta SEC(".maps");

/* (VIP, port or 0, protocol) of a farm with policies -> its policies. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct svc_key);
	__type(value, struct tbl_policy);
	__uint(max_entries, XLB_MAX_POLICY_KEYS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_tbl_policy SEC(".maps");

#ifndef XLB_TABLES_SOCK
/* Each CPU's copies of xlb_tbl_policy's entries (and absences) that its
 * packets used, stamped with the policy generation they were read under:
 * a stateless farm's packets have no conntrack entry to remember their
 * check in, and the hash lookup was most of what a policy cost them
 * (bench/results/tables.md). Direct-mapped by a hash of the service key;
 * not pinned (a new program starts empty). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct tbl_pcache);
	__uint(max_entries, XLB_TBL_PCACHE_SIZE);
} xlb_tbl_pcache SEC(".maps");
#endif

/* xlb_tbl_steer value: the farms chosen by source table on one service
 * key, in the order tried (their tables' priority, then farm name). */
struct tbl_steer {
	__u16 ids[XLB_MAX_SOURCE_FARMS]; /* host: the source tables' ids */
	__u8 tags[XLB_MAX_SOURCE_FARMS]; /* each farm's service key tag */
	__u32 n;			 /* host: entries used */
};

/* (VIP, port or 0, protocol), untagged -> the farms chosen by source table
 * there. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct svc_key);
	__type(value, struct tbl_steer);
	__uint(max_entries, XLB_MAX_POLICY_KEYS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_tbl_steer SEC(".maps");

/* [0]: XLB_TBL_CONF_* flags. Pinned, so a restarted program enforces the
 * policies from its first packet. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_tbl_conf SEC(".maps");

/**
 * tbl_find() - the most specific entry of the trie of slot @slot holding
 * the source address of @p, not counted.
 * Return: the entry, or NULL when the slot holds none (or has no trie).
 */
static __always_inline struct tbl_val *tbl_find(__u32 slot, const struct pkt *p)
{
	struct tbl_val *v;
	void *trie;

	if (p->k.family == XLB_AF_INET6) {
		struct tbl_key6 k6 = { .prefixlen = 128 };

		trie = bpf_map_lookup_elem(&xlb_tbl_addr6, &slot);
		if (!trie)
			return NULL;
		__builtin_memcpy(k6.addr, p->k.src, 16);
		v = bpf_map_lookup_elem(trie, &k6);
	} else {
		struct tbl_key4 k4 = { .prefixlen = 32, .addr = p->k.src[0] };

		trie = bpf_map_lookup_elem(&xlb_tbl_addr4, &slot);
		if (!trie)
			return NULL;
		v = bpf_map_lookup_elem(trie, &k4);
	}
	return v;
}

/**
 * tbl_match() - the most specific entry of the trie of slot @slot holding
 * the source address of @p, counted as a match of @len bytes.
 * Return: the entry, or NULL when the slot holds none (or has no trie).
 */
static __always_inline struct tbl_val *tbl_match(__u32 slot, const struct pkt *p, __u32 len)
{
	struct tbl_val *v = tbl_find(slot, p);

	if (v) {
		__sync_fetch_and_add(&v->packets, 1);
		__sync_fetch_and_add(&v->bytes, len);
	}
	return v;
}

/**
 * tbl_hmatch() - the entry of the hash of slot @slot (a number, mac, flow
 * or iface table: @flags, the binding's) that packet @p (source MAC and
 * interface @in) matches, counted as a match of @len bytes (in the XDP
 * program, @in->xdp, only when the table denies).
 * Return: the entry, or NULL.
 */
static __always_inline struct tbl_val *tbl_hmatch(__u32 slot, __u32 flags, const struct pkt *p,
						  const struct tbl_in *in, __u32 len)
{
	__u32 type = (flags >> XLB_TBL_T_SHIFT) & 0xf, ff = (flags >> XLB_TBL_FF_SHIFT) & 0x1f;
	struct tbl_hkey k = {};
	struct tbl_val *v;
	void *h;

	switch (type) {
	case XLB_TBL_T_NUMBER:
		k.sport = p->k.sport;
		break;
	case XLB_TBL_T_MAC:
		__builtin_memcpy(k.mac, in->smac, 6);
		break;
	case XLB_TBL_T_IFACE:
		if (!in->ifindex)
			return NULL; /* a socket's: no interface, no match (nft: meta iifname "") */
		k.ifindex = in->ifindex;
		break;
	case XLB_TBL_T_FLOW:
		if (ff & XLB_TBL_FF_SRC_IP)
			__builtin_memcpy(k.src, p->k.src, 16);
		if (ff & XLB_TBL_FF_DST_IP)
			__builtin_memcpy(k.dst, p->k.dst, 16);
		if (ff & (XLB_TBL_FF_SRC_IP | XLB_TBL_FF_DST_IP))
			k.family = p->k.family;
		if (ff & XLB_TBL_FF_PROTO)
			k.proto = p->k.proto;
		if (ff & XLB_TBL_FF_SRC_PORT)
			k.sport = p->k.sport;
		if (ff & XLB_TBL_FF_DST_PORT)
			k.dport = p->k.dport;
		break;
	default:
		return NULL;
	}
	h = bpf_map_lookup_elem(&xlb_tbl_hash, &slot);
	if (!h)
		return NULL;
	v = bpf_map_lookup_elem(h, &k);
	/* In the XDP program only a match that drops (tbl_one). */
	if (v && (!in->xdp || (flags & XLB_TBL_VERDICT_MASK) == XLB_TBL_DENY)) {
		__sync_fetch_and_add(&v->packets, 1);
		__sync_fetch_and_add(&v->bytes, len);
	}
	return v;
}

/**
 * tbl_steer_tag() - the tag of the farm chosen by source table that serves
 * the client of @p on service key @key: the first in xlb_tbl_steer's order
 * whose addr table holds the client (counting the match: a source table's
 * counters count the connections it steered).
 * Return: the tag (1-31), 0 for the default farm.
 */
static __attribute__((noinline)) __u32 tbl_steer_tag(const struct pkt *p, const struct svc_key *key)
{
	struct tbl_steer *st = bpf_map_lookup_elem(&xlb_tbl_steer, key);
	struct tbl_bind *b;
	__u32 i, id;

	if (!st)
		return 0;
	for (i = 0; i < XLB_MAX_SOURCE_FARMS; i++) {
		if (i >= st->n)
			break;
		id = st->ids[i];
		b = bpf_map_lookup_elem(&xlb_tbl_meta, &id);
		if (!b || (b->verdict >> XLB_TBL_T_SHIFT))
			continue;
		if (tbl_match(b->slot, p, 0))
			return st->tags[i];
	}
	return 0;
}

/**
 * svc_lookup() - the service of @key (VIP, port, protocol of @p's
 * destination) for @p's client: where farms chosen by source table share
 * the key, the one whose table holds the client, else the key's own.
 * @key keeps the key matched (tagged for a farm chosen by source table).
 * Return: the service, or NULL.
 */
static __always_inline struct svc_val *svc_lookup(const struct pkt *p, struct svc_key *key)
{
	__u32 zero = 0, *conf = bpf_map_lookup_elem(&xlb_tbl_conf, &zero);
	struct svc_val *svc;
	__u8 fam = key->family;
	__u32 tag;

	if (conf && (*conf & XLB_TBL_CONF_STEER)) {
		tag = tbl_steer_tag(p, key);
		if (tag) {
			key->family = fam | (tag << XLB_TBL_SIZE_SVC_TAG_SHIFT);
			svc = bpf_map_lookup_elem(&xlb_services, key);
			if (svc)
				return svc;
			key->family = fam;
		}
	}
	return bpf_map_lookup_elem(&xlb_services, key);
}

/**
 * svc_find() - the service of @p's destination: its port's, else its
 * VIP's every-port one (svc_lookup() each). @key is filled with the key
 * matched (its port 0 for an every-port farm's).
 * Return: the service, or NULL.
 */
static __always_inline struct svc_val *svc_find(const struct pkt *p, struct svc_key *key)
{
	struct svc_val *svc;

	__builtin_memcpy(key->addr, p->k.dst, 16);
	key->port = p->k.dport;
	key->proto = p->k.proto;
	key->family = p->k.family;
	svc = svc_lookup(p, key);
	if (!svc) {
		key->port = 0;
		svc = svc_lookup(p, key);
	}
	return svc;
}

/**
 * tbl_policies() - the policies of the farm @p is sent to, if it has any
 * (@conf: xlb_tbl_conf's value).
 * Return: the farm's policies, or NULL.
 */
static __always_inline struct tbl_policy *tbl_policies(const struct pkt *p, __u32 conf)
{
	struct svc_key key = {};
	struct tbl_policy *pol = NULL;

	if (!(conf & XLB_TBL_CONF_ANY))
		return NULL;
	__builtin_memcpy(key.addr, p->k.dst, 16);
	key.proto = p->k.proto;
	key.family = p->k.family;
	if (conf & XLB_TBL_CONF_PORT) {
		key.port = p->k.dport;
		pol = bpf_map_lookup_elem(&xlb_tbl_policy, &key);
	}
	if (!pol && (conf & XLB_TBL_CONF_ANYPORT)) {
		key.port = 0;
		pol = bpf_map_lookup_elem(&xlb_tbl_policy, &key);
	}
	return pol;
}

/* tbl_key_eq() - whether service keys @a and @b are equal. */
static __always_inline int tbl_key_eq(const struct svc_key *a, const struct svc_key *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;

	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3] && x[4] == y[4];
}

/**
 * tbl_key_refs() - the policies of service key @key (xlb_tbl_policy) into
 * @out, read through this CPU's copy (xlb_tbl_pcache) while the policy
 * generation @gen is not 0. The copy is trusted only under the generation
 * it was read under: the loader moves the generation on after every change
 * of a farm's policies (and stops it at 0 while it clears the copies, when
 * it wraps: clearPolicyCache), and a copy read before the change is
 * stamped with the older one. Only which tables a farm checks is copied:
 * their bindings and entries are looked up for every packet, so a table's
 * change, swap or flush needs nothing here. A run of the program can be
 * interrupted by another on its CPU (a test run by a packet's softirq):
 * the entry's seq is odd while it is written, and a read keeps its copy
 * only when seq did not move meanwhile (a seqlock between nested runs).
 * Return: the number of the key's policy tables (their ids in @out), -1
 * when the key has no policies.
 */
static __always_inline int tbl_key_refs(const struct svc_key *key, __u32 gen, struct tbl_refs *out)
{
	struct tbl_policy *pol;
	int n = -1;
#ifndef XLB_TABLES_SOCK
	struct tbl_pcache *c = NULL;
	__u32 idx, s;

	if (gen) {
		idx = (key->addr[0] ^ key->addr[1] ^ key->addr[2] ^ key->addr[3] ^
		       ((__u32)key->port << 16 | (__u32)key->proto << 8 | key->family)) *
		      0x9e3779b1U;
		idx >>= 32 - __builtin_ctz(XLB_TBL_PCACHE_SIZE);
		c = bpf_map_lookup_elem(&xlb_tbl_pcache, &idx);
	}
	if (c) {
		s = *(volatile __u32 *)&c->seq;
		if (!(s & 1) && c->gen == gen && tbl_key_eq(&c->key, key)) {
			n = c->n;
			__builtin_memcpy(out, &c->refs, sizeof(*out));
			asm volatile("" ::: "memory");
			if (*(volatile __u32 *)&c->seq == s)
				return n;
		}
	}
#endif
	pol = bpf_map_lookup_elem(&xlb_tbl_policy, key);
	n = -1;
	if (pol) {
		__builtin_memcpy(out, pol->ids, sizeof(*out));
		n = pol->n < XLB_MAX_FARM_POLICIES ? pol->n : XLB_MAX_FARM_POLICIES;
	}
#ifndef XLB_TABLES_SOCK
	if (c) {
		s = *(volatile __u32 *)&c->seq;
		if (!(s & 1)) {
			*(volatile __u32 *)&c->seq = s + 1;
			asm volatile("" ::: "memory");
			c->gen = gen;
			__builtin_memcpy(&c->key, key, sizeof(c->key));
			if (pol)
				__builtin_memcpy(&c->refs, pol->ids, sizeof(c->refs));
			c->n = n;
			asm volatile("" ::: "memory");
			*(volatile __u32 *)&c->seq = s + 2;
		}
	}
#endif
	return n;
}

/**
 * tbl_farm_refs() - the policies of the farm @p is sent to into @out, as
 * tbl_policies() finds them (@conf: xlb_tbl_conf's value), through this
 * CPU's copy (tbl_key_refs). Not inlined: its key stays out of the stack
 * of tbl_denied's calls (the verifier's 512 bytes for a chain of calls).
 * Return: the number of the farm's policy tables (0: none).
 */
static __attribute__((noinline)) int tbl_farm_refs(const struct pkt *p, __u32 conf,
						   struct tbl_refs *out)
{
	__u32 gen = (conf >> XLB_TBL_GEN_SHIFT) & XLB_TBL_GEN_MAX;
	struct svc_key key = {};
	int n;

	if (!(conf & XLB_TBL_CONF_ANY))
		return 0;
	__builtin_memcpy(key.addr, p->k.dst, 16);
	key.proto = p->k.proto;
	key.family = p->k.family;
	if (conf & XLB_TBL_CONF_PORT) {
		key.port = p->k.dport;
		n = tbl_key_refs(&key, gen, out);
		if (n >= 0)
			return n;
	}
	if (conf & XLB_TBL_CONF_ANYPORT) {
		key.port = 0;
		n = tbl_key_refs(&key, gen, out);
		if (n >= 0)
			return n;
	}
	return 0;
}

/**
 * tbl_svc_refs() - the policies of the farm @p is sent to into @out: from
 * its service's value @svc when that carries them under the current refs
 * generation (svc_val.tbl_gen), with no lookup; otherwise as
 * tbl_farm_refs() finds them. @conf: xlb_tbl_conf's value.
 * Return: the number of the farm's policy tables (0: none).
 */
static __always_inline int tbl_svc_refs(const struct pkt *p, __u32 conf, const struct svc_val *svc,
					struct tbl_refs *out)
{
	__u32 refs = (conf >> XLB_TBL_REFS_SHIFT) & XLB_TBL_REFS_MAX;

	if (svc && refs && svc->tbl_gen == refs) {
		__builtin_memcpy(out, svc->tbl_ids, sizeof(*out));
		return svc->tbl_n < XLB_MAX_FARM_POLICIES ? svc->tbl_n : XLB_MAX_FARM_POLICIES;
	}
	return tbl_farm_refs(p, conf, out);
}

/**
 * tbl_log() - put a record of the packet @p dropped by table @id's verdict
 * @verdict into xlb_events (a full ring buffer loses it: log_lost). Not
 * inlined: its stack stays out of the packet path's.
 * Return: 0.
 */
static __attribute__((noinline)) int tbl_log(const struct pkt *p, __u32 id, __u32 verdict,
					     __u32 xdp)
{
	struct tbl_event *e = bpf_ringbuf_reserve(&xlb_events, sizeof(*e), 0);

	if (!e) {
		stat_inc(XLB_STAT_LOG_LOST);
		return 0;
	}
	__builtin_memcpy(e->src, p->k.src, 16);
	__builtin_memcpy(e->dst, p->k.dst, 16);
	e->ts = bpf_ktime_get_coarse_ns();
	e->id = id;
	e->sport = p->k.sport;
	e->dport = p->k.dport;
	e->proto = p->k.proto;
	e->family = p->k.family;
	e->verdict = verdict;
	e->xdp = xdp;
	__builtin_memset(e->pad, 0, sizeof(e->pad));
	bpf_ringbuf_submit(e, 0);
	return 0;
}

/* tbl_set_values() - give the new flow of the packet being checked (a
 * stlsdnat packet: the packet) the values of entry @v of a table whose
 * verdict word is @verdict: its mark (struct scratch.mark, which the tcx
 * program reads when it creates the flow) where the table has marks, its
 * DSCP (scratch.dscp) where it has dscp values; a value 0 changes nothing.
 * @v NULL: clear both. One lookup of the scratch for both (one stack slot
 * for its key: tbl_one's frame is on the verifier's deepest chain). The
 * socket programs mark and rewrite nothing. */
static __always_inline void tbl_set_values(__u32 verdict, const struct tbl_val *v)
{
#ifndef XLB_TABLES_SOCK
	/* The values are read before the lookup: only they stay live across
	 * it, in registers. */
	__u32 mark = v && (verdict & XLB_TBL_F_MARK) ? v->mark : 0;
	__u8 dscp = v && (verdict & XLB_TBL_F_DSCP) ? v->dscp : 0;
	__u32 zero = 0;
	struct scratch *sc = bpf_map_lookup_elem(&xlb_scratch, &zero);

	if (!sc)
		return;
	if (mark || !v)
		sc->mark = mark;
	if (dscp || !v)
		sc->dscp = dscp;
#endif
}

/**
 * tbl_one() - the verdict of one table, bound by @b, on packet @p (source
 * MAC and interface @in), counting a match of @len bytes. For a new flow's packet
 * (@lim given) an addr table's match with a limit goes to *@lim if it is
 * the first, and its mark (not 0) becomes the flow's (tbl_set_values; a later
 * table's replaces it, as each nft table chain sets the mark again), and so
 * does its DSCP (a stlsdnat packet's own, as it has no flow). One
 * function, so the verifier's states of tbl_denied's loop stay alike
 * whatever kind of map matched.
 * Return: 1 when the table's verdict drops the packet, 0 otherwise.
 */
static __attribute__((noinline)) int tbl_one(const struct pkt *p, const struct tbl_in *in,
					     __u32 len, const struct tbl_bind *b,
					     struct tbl_val **lim)
{
	__u32 verdict = b->verdict & XLB_TBL_VERDICT_MASK;
	struct tbl_val *v;

	if (b->verdict >> XLB_TBL_T_SHIFT) {
		v = tbl_hmatch(b->slot, b->verdict, p, in, len);
		return (verdict == XLB_TBL_DENY && v) || (verdict == XLB_TBL_ALLOW && !v);
	}
	v = tbl_find(b->slot, p);
	if (!v)
		return verdict == XLB_TBL_ALLOW;
	/* The XDP program counts the matches it drops; a packet it passes
	 * goes on to the tcx program, which counts it (counted in both, a
	 * passing match was counted twice). */
	if (verdict == XLB_TBL_DENY || !in->xdp) {
		__sync_fetch_and_add(&v->packets, 1);
		__sync_fetch_and_add(&v->bytes, len);
	}
	if (verdict == XLB_TBL_DENY)
		return 1;
	if (!lim)
		return 0;
	if ((b->verdict & XLB_TBL_F_LIMIT) && v->limit && !*lim)
		*lim = v;
	if (b->verdict & (XLB_TBL_F_MARK | XLB_TBL_F_DSCP))
		tbl_set_values(b->verdict, v);
	return 0;
}

/**
 * tbl_denied() - whether the farm @p (source MAC and interface @in) is
 * sent to refuses its client: a
 * blacklist of the farm holds the client, or a whitelist does not (checked
 * in the farm's order; the first that drops decides, as the nft plane's
 * chains do). Matching entries count the packet (@len IP bytes); a table
 * with a log-prefix logs the drop (XLB_TBL_CONF_XDP in @conf: in the XDP
 * program). When @lim is given (a new flow's first packet), it gets the
 * first matching entry, in the farm's order, of a table with limits whose
 * limit is set: the caller rate limits new flows by it; and the flow gets
 * the mark of the last matching entry of a table with marks, and the DSCP
 * of the last of a table with dscp values (tbl_one).
 * @conf: xlb_tbl_conf's value.
 * Return: 1 to drop the packet, 0 otherwise.
 */
static __attribute__((noinline)) int tbl_denied(const struct pkt *p, const struct tbl_in *in,
						__u32 len, struct tbl_val **lim, __u32 conf)
{
	struct tbl_refs pol;
	struct tbl_bind *b;
	__u32 i, id, verdict, n = tbl_svc_refs(p, conf, in->svc, &pol);

	for (i = 0; i < XLB_MAX_FARM_POLICIES; i++) {
		if (i >= n)
			break;
		id = pol.ids[i];
		b = bpf_map_lookup_elem(&xlb_tbl_meta, &id);
		if (!b)
			continue;
		verdict = b->verdict & XLB_TBL_VERDICT_MASK;
		if (verdict == XLB_TBL_NONE &&
		    !(b->verdict & (XLB_TBL_F_LIMIT | XLB_TBL_F_MARK | XLB_TBL_F_DSCP)))
			continue;
		if (tbl_one(p, in, len, b, lim)) {
			if (b->verdict & XLB_TBL_F_LOG)
				tbl_log(p, id, verdict, !!(conf & XLB_TBL_CONF_XDP));
			return 1;
		}
	}
	return 0;
}

#ifndef XLB_TABLES_SOCK /* the install (xlb_sync.h), not the socket programs */
/**
 * tbl_client_values() - the mark and the DSCP the policies of the farm @p
 * is sent to give a new flow of @p's client, as tbl_one() gives them (the
 * last matching entry, in the farm's order, of an addr table with marks,
 * and of one with dscp values; 0 for none), without counting a match: for
 * a flow a peer synchronised (sync_bind()), whose packets were checked and
 * counted there. @conf: xlb_tbl_conf's value. Not inlined: one scalar
 * comes back to the install's loop.
 * Return: the mark in the low 32 bits, the DSCP in bits 32-39 (0: none).
 */
static __attribute__((noinline)) __u64 tbl_client_values(const struct pkt *p, __u32 conf)
{
	struct tbl_refs pol;
	struct tbl_bind *b;
	struct tbl_val *v;
	__u32 i, id, mark = 0, n = tbl_farm_refs(p, conf, &pol);
	__u64 dscp = 0;

	for (i = 0; i < XLB_MAX_FARM_POLICIES; i++) {
		if (i >= n)
			break;
		id = pol.ids[i];
		b = bpf_map_lookup_elem(&xlb_tbl_meta, &id);
		if (!b || (b->verdict >> XLB_TBL_T_SHIFT) ||
		    !(b->verdict & (XLB_TBL_F_MARK | XLB_TBL_F_DSCP)))
			continue;
		v = tbl_find(b->slot, p);
		if (!v)
			continue;
		if ((b->verdict & XLB_TBL_F_MARK) && v->mark)
			mark = v->mark;
		if ((b->verdict & XLB_TBL_F_DSCP) && v->dscp)
			dscp = v->dscp & 0x3f;
	}
	return mark | dscp << 32;
}
#endif

/* tbl_conf() - xlb_tbl_conf's value (0: no farm has policies). */
static __always_inline __u32 tbl_conf(void)
{
	__u32 zero = 0, *conf = bpf_map_lookup_elem(&xlb_tbl_conf, &zero);

	return conf ? *conf : 0;
}

/**
 * tbl_limited() - whether a new flow of a client matching @v goes past the
 * entry's limit: @v->limit new flows a second, in bursts of as many
 * (rate_limited() over the entry's @v->tat).
 * Return: 1 to drop the flow, 0 to admit it.
 */
static __always_inline int tbl_limited(struct tbl_val *v)
{
	__u32 limit = v->limit;
	__u64 iv;

	if (!limit)
		return 0;
	iv = 1000000000ULL / limit;
	return rate_limited(&v->tat, bpf_ktime_get_ns(), iv, iv * (limit - 1));
}

/**
 * tbl_new_limited() - tbl_limited() for packet @p, which has no conntrack
 * entry: a UDP packet or a TCP SYN starts a flow and takes a token; other
 * TCP packets are not flows to count (the program passes them on).
 * Return: 1 to drop the packet, 0 otherwise.
 */
static __always_inline int tbl_new_limited(const struct pkt *p, struct tbl_val *lim)
{
	if (p->k.proto == IPPROTO_TCP && !(p->tcp_flags & XLB_TCP_SYN))
		return 0;
	return tbl_limited(lim);
}

/**
 * tbl_check() - the policy check of packet @p (source MAC, zero when not
 * loaded, and interface @in), whose conntrack entry is @v (NULL: none), as
 * tbl_denied(), but for a tracked flow whose tuple passed its farm's
 * policies under the current policy generation: that costs one compare.
 * The loader moves the generation on after every change of tables,
 * bindings or farms' policies (so a client added to a deny list is cut off
 * from its established flows at its next packet), and when it wraps (127
 * changes) it stops the cache (generation 0), waits for every program run
 * to end, clears the generations of all entries (xlb_tbl_clear_gen) and
 * starts again at 1. The generation is read before the check, so a pass
 * against older tables is recorded under an older generation. A passing
 * packet records the generation in its entry's nh_flags (bits 1-7) with two
 * atomic operations on the aligned word that holds it (dir, state, mode,
 * nh_flags: other bytes are kept; the next hop's cache writes nh_flags
 * whole, which only clears the generation). Only a pass is recorded:
 * denied packets are checked (and counted) every time. A packet without
 * conntrack entry (@v NULL) starts a flow: in the tcx program the limit of
 * the first matching entry with one applies (tbl_new_limited), and its mark
 * tables give it its mark (struct scratch.mark: 0 when none, set here
 * for every such packet while some farm has tables, so no earlier packet's
 * is left; tbl_flow_mark() reads it), its dscp tables its DSCP (the same
 * in struct scratch.dscp, tbl_flow_dscp()). @xdp: in the XDP program.
 * Return: 1 to drop the packet, 0 otherwise.
 */
static __always_inline int tbl_check(const struct pkt *p, const struct tbl_in *in, struct ct_val *v,
				     __u32 len, __u32 xdp)
{
	__u32 conf = tbl_conf(), gen = (conf >> XLB_TBL_GEN_SHIFT) & XLB_TBL_GEN_MAX, *w;
	struct tbl_val *lim = NULL;

	if (!(conf & XLB_TBL_CONF_ANY))
		return 0;
	if (!v && !xdp)
		tbl_set_values(0, NULL);
	if (v && gen && ((v->nh_flags & XLB_TBL_NH_GEN_MASK) >> XLB_TBL_NH_GEN_SHIFT) == gen)
		return 0;
	/* Limits count flows the tcx program starts, not XDP's passes. */
	if (tbl_denied(p, in, len, v || xdp ? NULL : &lim, xdp ? conf | XLB_TBL_CONF_XDP : conf))
		return 1;
	if (lim && tbl_new_limited(p, lim))
		return 1;
	if (v && gen) {
		w = (__u32 *)&v->dir;
		__sync_fetch_and_and(w, ~((__u32)XLB_TBL_NH_GEN_MASK << 24));
		__sync_fetch_and_or(w, (gen << XLB_TBL_NH_GEN_SHIFT) << 24);
	}
	return 0;
}

#ifndef XLB_TABLES_SOCK /* the packet programs' (xlb_lb.c), not the socket programs' */

/**
 * tbl_flow_mark() - the mark tbl_check() gave the new flow of the packet
 * being handled, from @sc (xlb_scratch's value). Only while some farm has
 * tables: otherwise tbl_check() returned before setting it, and what is
 * there is an earlier packet's. Costs a compare when nothing set it.
 * Return: the mark, 0 for none.
 */
static __always_inline __u32 tbl_flow_mark(const struct scratch *sc)
{
	if (!sc->mark || !(tbl_conf() & XLB_TBL_CONF_ANY))
		return 0;
	return sc->mark;
}

/**
 * tbl_flow_dscp() - the DSCP tbl_check() gave the new flow (or stlsdnat
 * packet) being handled, from @sc, as tbl_flow_mark().
 * Return: the DSCP, 0 for none.
 */
static __always_inline __u8 tbl_flow_dscp(const struct scratch *sc)
{
	if (!sc->dscp || !(tbl_conf() & XLB_TBL_CONF_ANY))
		return 0;
	return sc->dscp & 0x3f;
}

/**
 * tbl_check_skb() - tbl_check() in the tcx program: loads the source MAC
 * when some farm has a mac table; the interface is the one the packet came
 * in on (a packet redirected here from another: that one). Not inlined:
 * the verifier sees one scalar come back, whatever the check went through.
 * Return: 1 to drop the packet, 0 otherwise.
 */
static __attribute__((noinline)) int tbl_check_skb(struct __sk_buff *skb, const struct pkt *p,
						   struct ct_val *v)
{
	struct tbl_in in = { .ifindex = skb->ingress_ifindex ?: skb->ifindex };

	if (tbl_conf() & XLB_TBL_CONF_MAC)
		bpf_skb_load_bytes(skb, 6, in.smac, 6);
	return tbl_check(p, &in, v, skb->len > ETH_HLEN ? skb->len - ETH_HLEN : 0, 0);
}

/**
 * tbl_check_new() - tbl_check_skb() for a packet @p without conntrack
 * entry, whose service's value @svc (NULL: none, or not looked up) gives
 * its farm's policies when it carries them (tbl_svc_refs). A global
 * function: the verifier checks it once, not again for every path that
 * reaches it (xlb_ingress is near the verifier's million instructions).
 * Its pointers may be NULL for the verifier (a global function's are).
 * Return: 1 to drop the packet, 0 otherwise.
 */
__attribute__((noinline)) int tbl_check_new(struct __sk_buff *skb, const struct pkt *p,
					    const struct svc_val *svc)
{
	struct tbl_in in = {};

	if (!skb || !p)
		return 0;
	in.ifindex = skb->ingress_ifindex ?: skb->ifindex;
	in.svc = svc;
	if (tbl_conf() & XLB_TBL_CONF_MAC)
		bpf_skb_load_bytes(skb, 6, in.smac, 6);
	return tbl_check(p, &in, NULL, skb->len > ETH_HLEN ? skb->len - ETH_HLEN : 0, 0);
}

/* tbl_clear_gen_one() - clear the policy generation of one conntrack entry
 * (bpf_for_each_map_elem callback). */
static long tbl_clear_gen_one(void *map, struct ct_key *k, struct ct_val *v, void *ctx)
{
	__sync_fetch_and_and((__u32 *)&v->dir, ~((__u32)XLB_TBL_NH_GEN_MASK << 24));
	return 0;
}

/**
 * xlb_tbl_clear_gen() - clear the policy generation of every conntrack
 * entry, when the generation wraps (tbl_check). Never attached; the loader
 * runs it with BPF_PROG_TEST_RUN.
 * Return: 0.
 */
SEC("syscall")
int xlb_tbl_clear_gen(void *ctx)
{
	bpf_for_each_map_elem(&xlb_ct, tbl_clear_gen_one, NULL, 0);
	return 0;
}

#endif /* XLB_TABLES_SOCK */

#endif /* XLB_TABLES_H */
