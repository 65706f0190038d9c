/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Active connections per backend, kept by the data path, and the
 * least-connection schedulers lc and wlc that read them.
 *
 * A backend's count (xlb_be_active, by backend id) is the number of its TCP
 * flows whose forward conntrack entry is in state SYN or EST: IPVS's
 * ActiveConn (which counts ESTABLISHED, and a new connection until its
 * first state change). +1 when the program creates a flow's forward entry
 * for a TCP SYN; -1 exactly once when that entry leaves SYN/EST, by a
 * FIN or RST (ct_set_state) or by its removal (expiry, backend gone, port
 * reuse: ct_delete). The leaving is an atomic compare-and-exchange on the
 * 32-bit word that holds the entry's state, so of two CPUs closing one
 * flow at once (FIN both ways) only one counts it. UDP flows are not
 * counted: a datagram flow has no close, so lc and wlc are for tcp farms.
 *
 * Not exact: an entry the LRU evicts while SYN/EST is never decremented
 * (a +1 per evicted live flow, until the program recreates the entry
 * from its peer, which keeps it counted); socket-LB connections
 * (xlb_sock.c) are never counted. User space removes flows through
 * xlb_ct_remove (xlb_lb.c), which counts them down. See
 * docs/dataplane-ebpf.md.
 */
#ifndef XLB_LC_H
#define XLB_LC_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "xlb_consts.h"
#include "xlb_structs.h"
#include "xlb_maps.h"

/* backend id -> active connections (atomic, shared by all CPUs; signed: a
 * count read below 0 is taken as 0). The loader zeroes an id's count when
 * it gives the id to a backend. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __s64);
	__uint(max_entries, XLB_MAX_BACKENDS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_be_active SEC(".maps");

/* lc_add() - add @d to backend @bid's active count. Backend 0 is none (a
 * flow a peer synchronised before its farm was here, xlb_sync.h): not
 * counted. */
static __always_inline void lc_add(__u32 bid, __s64 d)
{
	__s64 *c = bpf_map_lookup_elem(&xlb_be_active, &bid);

	if (c && bid)
		__sync_fetch_and_add(c, d);
}

static __always_inline int lc_counted(__u8 state)
{
	return state == XLB_CT_STATE_SYN || state == XLB_CT_STATE_EST;
}

/**
 * lc_set_state() - move forward entry @fv to @state; if that takes it out
 * of SYN/EST, and this CPU is the one that did it, count its backend one
 * connection less. dir, state, mode and nh_flags share one aligned 32-bit
 * word (struct ct_val), exchanged whole; state is its second byte
 * (little-endian, the only target built). A lost exchange (another CPU
 * changed the word) is retried a few times, then the state is written
 * plainly (not counted down: bounded by contention, in practice never).
 */
static __always_inline void lc_set_state(struct ct_val *fv, __u8 state)
{
	__u32 *w = (__u32 *)&fv->dir;
	__u32 old, nw;
	int i;

	for (i = 0; i < 4; i++) {
		old = *(volatile __u32 *)w;
		if (!lc_counted((old >> 8) & 0xff) || lc_counted(state)) {
			fv->state = state;
			return;
		}
		nw = (old & ~0xff00U) | ((__u32)state << 8);
		if (__sync_val_compare_and_swap(w, old, nw) == old) {
			lc_add(fv->backend, -1);
			return;
		}
	}
	fv->state = state;
}

/* lc_pick()'s state across its bpf_loop() steps. */
struct lc_scan {
	__u64 best_a; /* active connections of the best so far */
	__u64 best_w; /* its weight (1 for lc) */
	__u32 svc;
	__u32 n;
	__u32 best; /* backend id, 0 = none yet */
	__u32 wlc;
};

/* lc_step() - one backend of lc_pick(): slot @i of the service. */
static long lc_step(__u64 i, void *ctx)
{
	struct lc_scan *s = ctx;
	struct slot_key sk = { .svc = s->svc, .idx = (__u32)i };
	__u32 *bid, *wp, id;
	__u64 a = 0, w = 1;
	__s64 *c;

	if (i >= s->n)
		return 1;
	bid = bpf_map_lookup_elem(&xlb_slots, &sk);
	if (!bid)
		return 0;
	id = *bid;
	if (s->wlc) {
		sk.idx = XLB_LC_WEIGHT_IDX | (__u32)i;
		wp = bpf_map_lookup_elem(&xlb_slots, &sk);
		if (!wp || !*wp)
			return 0;
		w = *wp;
	}
	c = bpf_map_lookup_elem(&xlb_be_active, &id);
	if (c && *c > 0)
		a = *c;
	if (!s->best || a * s->best_w < s->best_a * w) {
		s->best = id;
		s->best_a = a;
		s->best_w = w;
	}
	return 0;
}

/**
 * lc_pick() - the serving backend of @svc with the fewest active
 * connections (lc), or the fewest per unit of weight (wlc: the smallest
 * active/weight, compared as active_a * weight_b < active_b * weight_a);
 * ties go to the first in the farm's order. The lc/wlc slots are one per
 * serving backend, in order; wlc's weights sit in xlb_slots under
 * idx XLB_LC_WEIGHT_IDX | i. A bpf_loop() of at most XLB_LC_MAX_BACKENDS
 * steps (the loader refuses larger farms): the verifier checks its step
 * once, where an unrolled loop of map lookups exhausts its budget.
 * Return: the backend id, 0 if none.
 */
static __always_inline __u32 lc_pick(struct svc_val *svc)
{
	struct lc_scan s = {
		.best_w = 1,
		.svc = svc->id,
		.n = svc->slots,
		.wlc = svc->sched == XLB_SCHED_WLC,
	};

	bpf_loop(XLB_LC_MAX_BACKENDS, lc_step, &s, 0);
	return s.best;
}

#endif /* XLB_LC_H */
