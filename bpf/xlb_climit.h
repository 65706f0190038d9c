/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* A farm's new-rtlimit, counted per client as nftlb counts it (the nft
 * plane's `add @nl-... { ip saddr limit rate over N/unit burst B packets }
 * drop`): each client of the farm has its own rate state, in an LRU hash
 * keyed by the farm's generation id and the client's address. A change of
 * the farm (a new generation) starts every client's state afresh; the nft
 * plane's set keeps it. See docs/dataplane-ebpf.md.
 */
#ifndef XLB_CLIMIT_H
#define XLB_CLIMIT_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "xlb_consts.h"
#include "xlb_structs.h"
#include "xlb_parsing.h"
#include "xlb_rate.h"

/* xlb_client_rt key: a client of a farm generation. */
struct client_key {
	__u32 svc;    /* host: svc_val.id */
	__u32 src[4]; /* net: client address */
};

/* (farm generation, client) -> the client's GCRA word (rate_limited). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct client_key);
	__type(value, __u64);
	__uint(max_entries, XLB_MAX_CLIENT_LIMITS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_client_rt SEC(".maps");

/**
 * client_new_limited() - whether packet @p, without conntrack entry, to the
 * farm @svc goes past its client's new-rtlimit. A UDP packet or a TCP SYN
 * starts a flow and takes a token; other packets are not flows to count.
 * Return: 1 to drop the packet, 0 otherwise.
 */
static __always_inline int client_new_limited(const struct pkt *p, const struct svc_val *svc)
{
	struct client_key k = {};
	__u64 zero = 0, *tat;

	if (!svc->new_iv)
		return 0;
	if (p->k.proto == IPPROTO_TCP && !(p->tcp_flags & XLB_TCP_SYN))
		return 0;
	k.svc = svc->id;
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
	return rate_limited(tat, bpf_ktime_get_ns(), svc->new_iv, svc->new_tol);
}

#endif /* XLB_CLIMIT_H */
