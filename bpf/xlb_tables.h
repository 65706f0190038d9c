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

/* Policies of one farm the program checks. */
#ifndef XLB_MAX_FARM_POLICIES
#define XLB_MAX_FARM_POLICIES 8
#endif

/* Service keys (VIP, protocol, port) of farms with policies. */
#ifndef XLB_MAX_POLICY_KEYS
#define XLB_MAX_POLICY_KEYS 65536
#endif

/* Values shared with Go (bpf2go -type; struct xlb_tbl_enums puts them in
 * the object's BTF). */
enum xlb_tbl_size {
	XLB_TBL_SIZE_TABLES = XLB_MAX_TABLES,
	XLB_TBL_SIZE_ENTRIES = XLB_MAX_TABLE_ENTRIES,
	XLB_TBL_SIZE_FARM_POLICIES = XLB_MAX_FARM_POLICIES,
	XLB_TBL_SIZE_POLICY_KEYS = XLB_MAX_POLICY_KEYS,
};

/* xlb_tbl_meta value: what a farm does with a client found in the table
 * (model.ListVerdict). */
enum xlb_tbl_verdict {
	XLB_TBL_NONE = 0,  /* not a policy */
	XLB_TBL_DENY = 1,  /* blacklist: a match drops */
	XLB_TBL_ALLOW = 2, /* whitelist: no match drops */
};

/* xlb_tbl_conf value: which policy lookups a packet needs. */
enum xlb_tbl_conf_flag {
	XLB_TBL_CONF_PORT = 1,	  /* some farm of given ports has policies */
	XLB_TBL_CONF_ANYPORT = 2, /* some farm of every port (port 0) has policies */
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

/* Inner map value: an entry's counters and value fields
 * (model.TableValue). The counters are shared by all CPUs (an LPM trie has
 * no per-CPU flavour) and added atomically on a match; the loader keeps
 * them when it replaces an entry's value. */
struct tbl_val {
	__u64 packets; /* host */
	__u64 bytes;   /* host: IP bytes */
	__u32 mark;    /* host */
	__u32 limit;   /* host */
	__u32 tag;     /* host */
	__u8 dscp;
	__u8 pad[3];
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

struct tbl_enums {
	enum xlb_tbl_size size;
	enum xlb_tbl_verdict verdict;
	enum xlb_tbl_conf_flag conf;
};

/* Never read: puts the enums and structs into the BTF for bpf2go. */
const struct tbl_enums *xlb_tbl_enums_btf __attribute__((unused));
const struct tbl_val *xlb_unused_tbl_val __attribute__((unused));
const struct tbl_key4 *xlb_unused_tbl_key4 __attribute__((unused));
const struct tbl_key6 *xlb_unused_tbl_key6 __attribute__((unused));
const struct tbl_bind *xlb_unused_tbl_bind __attribute__((unused));

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
 * tbl_match() - the most specific entry of the trie of slot @slot holding
 * the source address of @p, counted as a match of @len bytes.
 * Return: the entry, or NULL when the slot holds none (or has no trie).
 */
static __always_inline struct tbl_val *tbl_match(__u32 slot, const struct pkt *p, __u32 len)
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
	if (v) {
		__sync_fetch_and_add(&v->packets, 1);
		__sync_fetch_and_add(&v->bytes, len);
	}
	return v;
}

/**
 * tbl_policies() - the policies of the farm @p is sent to, if it has any.
 * Return: the farm's policies, or NULL.
 */
static __always_inline struct tbl_policy *tbl_policies(const struct pkt *p)
{
	struct svc_key key = {};
	struct tbl_policy *pol = NULL;
	__u32 zero = 0, *conf;

	conf = bpf_map_lookup_elem(&xlb_tbl_conf, &zero);
	if (!conf || !*conf)
		return NULL;
	__builtin_memcpy(key.addr, p->k.dst, 16);
	key.proto = p->k.proto;
	key.family = p->k.family;
	if (*conf & XLB_TBL_CONF_PORT) {
		key.port = p->k.dport;
		pol = bpf_map_lookup_elem(&xlb_tbl_policy, &key);
	}
	if (!pol && (*conf & XLB_TBL_CONF_ANYPORT)) {
		key.port = 0;
		pol = bpf_map_lookup_elem(&xlb_tbl_policy, &key);
	}
	return pol;
}

/**
 * tbl_denied() - whether the farm @p is sent to refuses its client: a
 * blacklist of the farm holds the client, or a whitelist does not (checked
 * in the farm's order; the first that drops decides, as the nft plane's
 * chains do). Matching entries count the packet (@len IP bytes).
 * Return: 1 to drop the packet, 0 otherwise.
 */
static __attribute__((noinline)) int tbl_denied(const struct pkt *p, __u32 len)
{
	struct tbl_policy *pol = tbl_policies(p);
	struct tbl_bind *b;
	struct tbl_val *v;
	__u32 i, id;

	if (!pol)
		return 0;
	for (i = 0; i < XLB_MAX_FARM_POLICIES; i++) {
		if (i >= pol->n)
			break;
		id = pol->ids[i];
		b = bpf_map_lookup_elem(&xlb_tbl_meta, &id);
		if (!b || b->verdict == XLB_TBL_NONE)
			continue;
		v = tbl_match(b->slot, p, len);
		if (b->verdict == XLB_TBL_DENY && v)
			return 1;
		if (b->verdict == XLB_TBL_ALLOW && !v)
			return 1;
	}
	return 0;
}

#endif /* XLB_TABLES_H */
