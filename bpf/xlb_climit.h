/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* A farm's new-rtlimit and rst-rtlimit, counted per client as nftlb
 * counts them (the nft plane's `add @nl-... { ip saddr limit rate over
 * N/unit burst B packets } drop`, and @rl-... for TCP resets): each client
 * of the farm has its own rate state, in an LRU hash keyed by the farm's
 * own id (xlb_svc_flags' bits 16-31, the same in every generation of the
 * farm), the limit and the client's address, so a change of the farm keeps
 * each client's state as the nft plane's set does. A generation without a
 * farm id (written by a version before them) keys by its generation id.
 * See docs/dataplane-ebpf.md.
 */
#ifndef XLB_CLIMIT_H
#define XLB_CLIMIT_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "xlb_consts.h"
#include "xlb_structs.h"
#include "xlb_maps.h"
#include "xlb_tables.h" /* svc_lookup */
#include "xlb_parsing.h"
#include "xlb_rate.h"

/* Which of a farm's limits a client_key counts. */
enum xlb_climit {
	XLB_CLIMIT_NEW = 0, /* new-rtlimit: new flows */
	XLB_CLIMIT_RST = 1, /* rst-rtlimit: TCP resets */
};

/* xlb_client_rt key: a client of a farm, for one limit. */
struct client_key {
	__u32 farm; /* host: the farm's id | 1 << 16, else its generation's (svc_val.id < 1 << 16) */
	__u32 limit;  /* host: XLB_CLIMIT_* */
	__u32 src[4]; /* net: client address */
};

/* (farm, limit, client) -> the client's GCRA word (rate_limited). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct client_key);
	__type(value, __u64);
	__uint(max_entries, XLB_MAX_CLIENT_LIMITS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_client_rt SEC(".maps");

/**
 * client_limited() - rate_limited() for the client of packet @p, under
 * limit @limit (XLB_CLIMIT_*) of the farm generation @svc: one event every
 * @iv ns, @tol ns ahead at most.
 * Return: 1 to drop the packet, 0 otherwise.
 */
static __always_inline int client_limited(const struct pkt *p, __u32 svc, __u32 limit, __u64 iv,
					  __u64 tol)
{
	struct client_key k = {};
	__u64 zero = 0, *tat;
	__u32 *fl = bpf_map_lookup_elem(&xlb_svc_flags, &svc);

	k.farm = svc;
	if (fl && (*fl >> XLB_SVC_FARM_SHIFT))
		k.farm = (*fl >> XLB_SVC_FARM_SHIFT) | (1 << XLB_SVC_FARM_SHIFT);
	k.limit = limit;
	__builtin_memcpy(k.src, p->k.src, 16);
	tat = bpf_map_lookup_elem(&xlb_client_rt, &k);
	if (!tat) {
		/* A new client: a zero word is a full burst. Another CPU may
		 * have added it first (BPF_NOEXIST fails): use theirs. */
		bpf_map_update_elem(&xlb_client_rt, &k, &zero, BPF_NOEXIST);
		tat = bpf_map_lookup_elem(&xlb_client_rt, &k);
		if (!tat)
			return 0;
	}
	return rate_limited(tat, bpf_ktime_get_ns(), iv, tol);
}

/**
 * client_new_limited() - whether packet @p, without conntrack entry, to the
 * farm @svc goes past its client's new-rtlimit. A UDP packet or a TCP SYN
 * starts a flow and takes a token; other packets are not flows to count.
 * Return: 1 to drop the packet, 0 otherwise.
 */
static __always_inline int client_new_limited(const struct pkt *p, const struct svc_val *svc)
{
	if (!svc->new_iv)
		return 0;
	if (p->k.proto == IPPROTO_TCP && !(p->tcp_flags & XLB_TCP_SYN))
		return 0;
	return client_limited(p, svc->id, XLB_CLIMIT_NEW, svc->new_iv, svc->new_tol);
}

/**
 * client_rst_limited() - whether TCP packet @p with RST, tracked or not, to
 * a farm goes past its client's rst-rtlimit (nft: every packet to the farm
 * is checked, not only a flow's first). Other packets cost one test; a
 * reset looks its farm up by destination (and source, for farms chosen by
 * source table: svc_lookup). Not inlined: resets are rare.
 * Return: 1 to drop the packet, 0 otherwise.
 */
static __attribute__((noinline)) int client_rst_limited(const struct pkt *p)
{
	struct svc_key key = {};
	struct svc_val *svc;

	if (p->k.proto != IPPROTO_TCP)
		return 0;
	__builtin_memcpy(key.addr, p->k.dst, 16);
	key.port = p->k.dport;
	key.proto = p->k.proto;
	key.family = p->k.family;
	svc = svc_lookup(p, &key);
	if (!svc) {
		key.port = 0;
		svc = svc_lookup(p, &key);
	}
	if (!svc || !svc->rst_iv)
		return 0;
	return client_limited(p, svc->id, XLB_CLIMIT_RST, svc->rst_iv, svc->rst_tol);
}

#endif /* XLB_CLIMIT_H */
