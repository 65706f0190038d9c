/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Passive health checks: the outcome of each new TCP connection's handshake
 * as the program's own conntrack sees it, counted per backend for the
 * daemon's outlier detection (Envoy's consecutive failures; see
 * docs/health.md and internal/health/passive.go).
 *
 * Only backends the loader lists in xlb_passive are watched (those of farms
 * whose check has "passive"). A new flow to one of them leaves its forward
 * key in xlb_passive_syn; the first answer from the backend side takes it
 * out and is counted:
 *   - the backend's SYN-ACK within the timeout: a success (the consecutive
 *     failures go back to 0);
 *   - a RST from the backend, an ICMP unreachable about the SYN, or a
 *     SYN-ACK later than the timeout: a failure.
 * A SYN that gets no answer at all stays in xlb_passive_syn; the daemon
 * sweeps entries older than the timeout and counts each as a failure.
 * Whoever deletes the entry counts it, so each connection counts once.
 *
 * The header is included by xlb_lb.c after ct_peer_key() and xlb_now().
 *
 * Clients cannot fake a backend failure: a client's RST or a SYN flood
 * (no ACK from the client) still sees the backend's SYN-ACK first.
 */
#ifndef XLB_PASSIVE_H
#define XLB_PASSIVE_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "xlb_consts.h"
#include "xlb_structs.h"

/* Backends watched at once. */
#ifndef XLB_MAX_PASSIVE
#define XLB_MAX_PASSIVE 65536
#endif

/* What answered a handshake (passive_answer). */
#define XLB_PASSIVE_OK 0
#define XLB_PASSIVE_RESET 1
#define XLB_PASSIVE_UNREACH 2

/* Handshakes in flight on watched backends. LRU: under a flood the oldest
 * go first, uncounted (a failure missed, never one made up). */
#ifndef XLB_PASSIVE_SYN_SIZE
#define XLB_PASSIVE_SYN_SIZE 65536
#endif

/* xlb_passive value (key: __u32 backend id, host order). Written by the
 * loader (zeroed, with timeout_ns), updated atomically by the program. */
struct passive_be {
	__u32 consec; /* host: failures since the last success */
	__u32 pad;
	__u64 timeout_ns; /* host: an answer later than this is a failure (loader) */
	__u64 ok;	  /* host: SYN-ACKs within the timeout */
	__u64 reset;	  /* host: RSTs from the backend before establishment */
	__u64 unreach;	  /* host: ICMP unreachable about a SYN */
	__u64 slow;	  /* host: SYN-ACKs later than the timeout */
	__u64 last_ok;	  /* host: xlb_now() of the last success */
};

/* xlb_passive_syn value (key: the flow's forward struct ct_key). */
struct passive_syn {
	__u32 backend; /* host: backend id */
	__u32 pad;
	__u64 ts; /* host: xlb_now() of the SYN */
};

/* backend id -> its passive counts: the watched backends. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct passive_be);
	__uint(max_entries, XLB_MAX_PASSIVE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_passive SEC(".maps");

/* forward key of a flow to a watched backend -> its SYN, until answered. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_key);
	__type(value, struct passive_syn);
	__uint(max_entries, XLB_PASSIVE_SYN_SIZE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_passive_syn SEC(".maps");

/* Keep both value types in the BTF for bpf2go. */
const struct passive_be *xlb_unused_passive_be __attribute__((unused));
const struct passive_syn *xlb_unused_passive_syn __attribute__((unused));

/**
 * passive_syn_sent() - a new TCP flow with forward key @k went to backend
 * @bid at @now: remember its SYN if the backend is watched.
 */
static __attribute__((noinline)) int passive_syn_sent(const struct ct_key *k, __u32 bid, __u64 now)
{
	struct passive_syn s = { .backend = bid, .ts = now };

	if (!bpf_map_lookup_elem(&xlb_passive, &bid))
		return 0;
	bpf_map_update_elem(&xlb_passive_syn, k, &s, BPF_ANY);
	return 0;
}

/**
 * passive_new_flow() - hook for a new TCP flow of service generation @svc
 * (forward key @k, backend @bid): watched if its farm has passive checks
 * (XLB_SVC_F_PASSIVE, an inlined array lookup: farms without pay no more).
 */
static __always_inline void passive_new_flow(const struct ct_key *k, __u32 svc, __u32 bid,
					     __u64 now)
{
	__u32 *fl = bpf_map_lookup_elem(&xlb_svc_flags, &svc);

	if (fl && (*fl & XLB_SVC_F_PASSIVE))
		passive_syn_sent(k, bid, now);
}

/* passive_fail() - count one failure of @pb in counter @c. */
static __always_inline void passive_fail(struct passive_be *pb, __u64 *c)
{
	__sync_fetch_and_add(&pb->consec, 1);
	__sync_fetch_and_add(c, 1);
}

/**
 * passive_answer() - the first answer from the backend side to the
 * handshake of the flow whose forward key is @fk.
 * @fk: forward key (the peer of the reply entry the answer matched)
 * @what: XLB_PASSIVE_OK (a SYN-ACK), XLB_PASSIVE_RESET or XLB_PASSIVE_UNREACH
 * @now: xlb_now()
 */
static __always_inline void passive_answer(const struct ct_key *fk, __u32 what, __u64 now)
{
	struct passive_syn *s = bpf_map_lookup_elem(&xlb_passive_syn, fk);
	struct passive_be *pb;
	__u32 bid;
	__u64 ts;

	if (!s)
		return;
	bid = s->backend;
	ts = s->ts;
	/* The one that deletes the entry counts it (the sweep, another CPU). */
	if (bpf_map_delete_elem(&xlb_passive_syn, fk))
		return;
	pb = bpf_map_lookup_elem(&xlb_passive, &bid);
	if (!pb)
		return;
	switch (what) {
	case XLB_PASSIVE_RESET:
		passive_fail(pb, &pb->reset);
		break;
	case XLB_PASSIVE_UNREACH:
		passive_fail(pb, &pb->unreach);
		break;
	default:
		if (now - ts > pb->timeout_ns && (__s64)(now - ts) > 0) {
			passive_fail(pb, &pb->slow);
			break;
		}
		/* Written only when it changes: the line stays shared while
		 * the backend is healthy. */
		if (pb->consec)
			pb->consec = 0;
		pb->last_ok = now;
		__sync_fetch_and_add(&pb->ok, 1);
	}
}

/**
 * passive_reply() - hook for a reply-direction TCP packet of a flow still in
 * its handshake (@v the reply entry of key @k, @flags the packet's): a
 * SYN-ACK or a RST is the backend's answer. Not inlined: its stack stays
 * out of the conntrack-hit path's.
 * Return: 0.
 */
static __attribute__((noinline)) int passive_reply(const struct ct_key *k, const struct ct_val *v,
						   __u32 flags, __u64 now)
{
	struct ct_key fk;
	__u32 what;

	if (flags & XLB_TCP_RST)
		what = XLB_PASSIVE_RESET;
	else if ((flags & (XLB_TCP_SYN | XLB_TCP_ACK)) == (XLB_TCP_SYN | XLB_TCP_ACK))
		what = XLB_PASSIVE_OK;
	else
		return 0;
	ct_peer_key(k, v, &fk);
	passive_answer(&fk, what, now);
	return 0;
}

/**
 * passive_icmp() - hook for an ICMP unreachable about a packet we sent
 * towards a backend (not "fragmentation needed" or "packet too big": the
 * caller checks): @k is the reply entry's key the quote maps to, @v its
 * entry. Counted while the flow is in its handshake.
 * Return: 0.
 */
static __attribute__((noinline)) int passive_icmp(const struct ct_key *k, const struct ct_val *v)
{
	struct ct_key fk;

	if (k->proto != IPPROTO_TCP || v->dir != XLB_CT_REPLY || v->state != XLB_CT_STATE_SYN)
		return 0;
	ct_peer_key(k, v, &fk);
	passive_answer(&fk, XLB_PASSIVE_UNREACH, xlb_now());
	return 0;
}

#endif /* XLB_PASSIVE_H */
