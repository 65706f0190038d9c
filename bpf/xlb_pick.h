/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Backend selection: a service's scheduler, its persistence, and the counter
 * helper they use. Shared by the tc program (xlb_lb.c: a packet's tuple) and
 * the socket programs (xlb_sock.c: a connect() or sendmsg(), with the tuple
 * known at that time), so both pick backends the same way from the same
 * maps.
 */
#ifndef XLB_PICK_H
#define XLB_PICK_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "xlb_consts.h"
#include "xlb_structs.h"
#include "xlb_maps.h"
#include "xlb_parsing.h"
#include "xlb_csum.h"
#include "xlb_flowhash.h"
#include "xlb_lc.h"

/* xlb_elapsed() - ns from @then to @now; 0 if @then is later (a timestamp of
 * another CPU or an earlier program may be a tick ahead: see xlb_lb.c's clock). */
static __always_inline __u64 xlb_elapsed(__u64 now, __u64 then)
{
	__s64 d = (__s64)(now - then);

	return d > 0 ? (__u64)d : 0;
}

/* stat_inc() - count one event in xlb_stats (enum xlb_stat). */
static __always_inline void stat_inc(__u32 idx)
{
	__u64 *c = bpf_map_lookup_elem(&xlb_stats, &idx);

	if (c)
		*c += 1;
}

/**
 * lb4_schedule() - pick a backend of service @svc for packet @p.
 * Return: the backend id, 0 if none.
 */
static __always_inline __u32 lb4_schedule(struct pkt *p, struct svc_val *svc)
{
	struct slot_key sk = { .svc = svc->id };
	__u32 *bid, *ctr, h;

	switch (svc->sched) {
	case XLB_SCHED_RR:
		ctr = bpf_map_lookup_elem(&xlb_rr, &svc->id);
		if (!ctr)
			return 0;
		sk.idx = __sync_fetch_and_add(ctr, 1) % svc->slots;
		break;
	case XLB_SCHED_WEIGHT:
		sk.idx = bpf_get_prandom_u32() % svc->slots;
		break;
	case XLB_SCHED_SYMHASH: {
		/* The same value for the tuple and its reverse: both
		 * addresses (XLB_HASH_SRCIP) and/or both ports
		 * (XLB_HASH_SRCPORT), each pair in sorted order. */
		__u32 a = addr_fold(p->k.src), b = addr_fold(p->k.dst);
		__u16 x = bpf_ntohs(p->k.sport), y = bpf_ntohs(p->k.dport);

		if (a > b) {
			a = addr_fold(p->k.dst);
			b = addr_fold(p->k.src);
		}
		if (x > y) {
			x = bpf_ntohs(p->k.dport);
			y = bpf_ntohs(p->k.sport);
		}
		if (!(svc->hash_keys & XLB_HASH_SRCIP))
			a = b = 0;
		if (!(svc->hash_keys & XLB_HASH_SRCPORT))
			x = y = 0;
		h = xlb_jhash_3words(a, b, ((__u32)x << 16) | y, XLB_HASH_SEED ^ p->k.proto);
		sk.idx = h % svc->slots;
		break;
	}
	case XLB_SCHED_LC:
	case XLB_SCHED_WLC:
		return lc_pick(svc);
	case XLB_SCHED_MAGLEV:
		/* The same slot as the nft plane and every node: the table
		 * comes from plan.Maglev, the hash is plan.FlowSlot's. */
		sk.idx = xlb_scale(xlb_flow_hash(&p->k), svc->slots);
		break;
	default: /* XLB_SCHED_HASH */
		/* The same slot as the nft plane and every node: the slots
		 * come from plan.HashTable, the hash is plan.FlowSlot's. */
		sk.idx = xlb_scale(xlb_flow_hash_keys(&p->k, svc->hash_keys), svc->slots);
		break;
	}
	bid = bpf_map_lookup_elem(&xlb_slots, &sk);
	return bid ? *bid : 0;
}

/**
 * lb4_persistent() - the backend a persistent client of @svc was last sent
 * to, if that was less than the service's TTL ago and the backend is still
 * in the service's current generation.
 * Return: the backend id, 0 if none.
 */
static __always_inline __u32 lb4_persistent(struct persist_key *pk, struct svc_val *svc, __u64 now)
{
	struct be_index_key ik = { .svc = svc->id };
	struct persist_val *pv;
	__u32 *bid;

	pv = bpf_map_lookup_elem(&xlb_persist, pk);
	if (!pv || xlb_elapsed(now, pv->seen) > (__u64)svc->persist_ttl * 1000000000ULL)
		return 0;
	__builtin_memcpy(ik.addr, pv->addr, 16);
	ik.port = pv->port;
	bid = bpf_map_lookup_elem(&xlb_be_index, &ik);
	if (!bid)
		return 0;
	stat_inc(XLB_STAT_PERSIST_HIT);
	return *bid;
}

/**
 * lb4_static() - the backend a static session of @svc pins the client of
 * @pk to, if that backend serves in the service's current generation (a
 * client whose backend does not serve now is scheduled as any other, as on
 * the nft plane).
 * Return: the backend id, 0 if none.
 */
static __always_inline __u32 lb4_static(struct persist_key *pk, struct svc_val *svc)
{
	struct be_index_key ik = { .svc = svc->id };
	struct persist_val *pv;
	__u32 *bid;

	pv = bpf_map_lookup_elem(&xlb_static, pk);
	if (!pv)
		return 0;
	__builtin_memcpy(ik.addr, pv->addr, 16);
	ik.port = pv->port;
	bid = bpf_map_lookup_elem(&xlb_be_index, &ik);
	return bid ? *bid : 0;
}

#ifdef XLB_SYNC_SESSIONS
/* xlb_sync.h: tells the peers of a session made or moved (xlb_lb.c only;
 * the socket program's sessions are the node's own). */
static __attribute__((noinline)) int
sync_session(const struct persist_key *pk, const struct persist_val *pv, const struct svc_val *svc);
#endif

/**
 * lb4_pick() - the backend for a new flow of service @svc (found under
 * @key): the client's persistent one if any, else the scheduler's choice,
 * which is then recorded for persistence. A function of its own (not
 * inlined) to keep its stack out of the caller's.
 * Return: the backend id, 0 if none.
 */
static __attribute__((noinline)) __u32 lb4_pick(struct pkt *p, struct svc_val *svc,
						struct svc_key *key, __u64 now)
{
	struct persist_key pk = {};
	struct backend *be;
	__u32 bid = 0;

	if (!svc->persist)
		return lb4_schedule(p, svc);
	__builtin_memcpy(&pk.svc, key, sizeof(*key));
	if (svc->persist & XLB_HASH_SRCIP)
		__builtin_memcpy(pk.src, p->k.src, 16);
	if (svc->persist & XLB_HASH_SRCPORT)
		pk.sport = p->k.sport;
	/* A static session wins, and records no dynamic one. */
	if (svc->persist & XLB_HASH_STATIC) {
		bid = lb4_static(&pk, svc);
		if (bid)
			return bid;
	}
	bid = lb4_persistent(&pk, svc, now);
	if (!bid)
		bid = lb4_schedule(p, svc);
	be = bid ? bpf_map_lookup_elem(&xlb_backends, &bid) : NULL;
	if (be) {
		struct persist_val pv = { .port = be->port, .seen = now };

		__builtin_memcpy(pv.addr, be->addr, 16);
#ifdef XLB_SYNC_SESSIONS
		sync_session(&pk, &pv, svc);
#endif
		bpf_map_update_elem(&xlb_persist, &pk, &pv, BPF_ANY);
	}
	return bid;
}

#endif /* XLB_PICK_H */
