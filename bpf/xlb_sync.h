/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Connection sync on the eBPF plane (docs/ha.md): the program's own
 * conntrack, streamed to the other nodes of a cluster and installed from
 * them, so a node can carry a snat or dnat flow it has never seen when the
 * routers move it there.
 *
 * Out: sync_emit() writes a struct sync_conn to the xlb_sync ring buffer
 * when a flow of a snat or dnat farm is created, changes TCP state, is
 * still alive (at most every xlb_sync_refresh_ns, so a peer's copy does not
 * idle out while the flow is carried here), or is deleted from user space
 * (xlb connections delete); and sync_session() writes one when a
 * persistence session (xlb_persist) is made, moves to another backend, or
 * is refreshed by the client's new flows (at most every third of its
 * TTL), so a client the routers move keeps its backend. Expiry is not sent: a peer's copy idles out by
 * itself, and a flow idle here may be live there. Records go out only while
 * the daemon reads them (xlb_sync_on), without a wake-up while it reads
 * every few milliseconds (a wake-up, or even asking the ring whether one
 * is due, cost more per record than the record); a reader that found the
 * ring empty sleeps until a record wakes it (xlb_sync_wake), so an idle
 * node does not poll.
 *
 * In: xlb_ct_install, a syscall program the loader runs with
 * BPF_PROG_TEST_RUN over a peer's batch in xlb_sync_in, writes both
 * entries of each flow as lb4_new_flow() would have (the local service
 * generation and backend id, found by address; the next hop left to be
 * resolved by the first packet), keeps xlb_be_active right (xlb_lc.h), and
 * updates or removes flows it already has; a session goes into xlb_persist
 * (sync_install_session()). One system call per batch.
 *
 * The header is included by xlb_lb.c after ct_delete() and lc_set_state().
 */
#ifndef XLB_SYNC_H
#define XLB_SYNC_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "xlb_consts.h"
#include "xlb_structs.h"
#include "xlb_maps.h"

/* 1 while the daemon reads xlb_sync (Plane.WatchConns sets and clears it). */
volatile __u32 xlb_sync_on = 0;

/* 1 while the daemon's reader, having found xlb_sync empty, sleeps until
 * a record wakes it (Plane.WatchConns clears it when woken). */
volatile __u32 xlb_sync_wake = 0;

/* Records lost because xlb_sync was full; the daemon then resyncs its
 * peers whole. */
volatile __u64 xlb_sync_lost = 0;

/* A live flow tells the peers so at most this often (set by the loader
 * below the shortest idle timeout of an established flow). */
volatile const __u64 xlb_sync_refresh_ns = 60000000000ULL;

/* sync_submit() - hand record @e to the reader: woken only if it sleeps
 * (xlb_sync_wake); else it takes the record at its next read. */
static __always_inline void sync_submit(struct sync_conn *e)
{
	bpf_ringbuf_submit(e, xlb_sync_wake ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

/* sync_mode() - whether flows of @mode carry state a peer needs. */
static __always_inline int sync_mode(__u8 mode)
{
	return mode == XLB_MODE_SNAT || mode == XLB_MODE_DNAT;
}

/* sync_due() - whether a flow last refreshed at @then, refreshed at @now,
 * crossed an xlb_sync_refresh_ns boundary: about one "alive" record per
 * interval per flow, with no state kept for it. */
static __always_inline int sync_due(__u64 then, __u64 now)
{
	return xlb_sync_on && then / xlb_sync_refresh_ns != now / xlb_sync_refresh_ns;
}

/**
 * sync_emit() - send the flow of entry (@k, @v), either direction, to the
 * daemon as a @kind record (enum xlb_sync_kind). Only flows of snat and dnat
 * farms, only while the daemon reads. A full ring buffer loses the record
 * (xlb_sync_lost). Not inlined: its stack stays out of the packet path's.
 * Return: 0.
 */
static __attribute__((noinline)) int sync_emit(__u8 kind, const struct ct_key *k,
					       const struct ct_val *v)
{
	struct sync_conn *e;

	if (!xlb_sync_on || !sync_mode(v->mode))
		return 0;
	e = bpf_ringbuf_reserve(&xlb_sync, sizeof(*e), 0);
	if (!e) {
		__sync_fetch_and_add(&xlb_sync_lost, 1);
		return 0;
	}
	if (v->dir == XLB_CT_FWD) {
		__builtin_memcpy(e->client, k->src, 16);
		__builtin_memcpy(e->vip, k->dst, 16);
		__builtin_memcpy(e->backend, v->dst, 16);
		__builtin_memcpy(e->reply, v->src, 16);
		e->cport = k->sport;
		e->vport = k->dport;
		e->bport = v->dport;
		e->rport = v->sport;
	} else {
		__builtin_memcpy(e->client, v->dst, 16);
		__builtin_memcpy(e->vip, v->src, 16);
		__builtin_memcpy(e->backend, k->src, 16);
		__builtin_memcpy(e->reply, k->dst, 16);
		e->cport = v->dport;
		e->vport = v->sport;
		e->bport = k->sport;
		e->rport = k->dport;
	}
	e->kind = kind;
	e->proto = k->proto;
	e->family = k->family;
	e->state = v->state;
	e->left = 0;
	e->rc = 0;
	e->pad = 0;
	sync_submit(e);
	return 0;
}

/**
 * sync_session() - before lb4_pick() writes session (@pk, @pv) of @svc,
 * tell the peers if it is new, moved to another backend, or the client's
 * new flows here have crossed a third of the TTL since the last record (so
 * the peers' copies do not expire while the client is carried here). Only
 * while the daemon reads. A full ring buffer loses the record
 * (xlb_sync_lost).
 * Return: 0.
 */
static __attribute__((noinline)) int
sync_session(const struct persist_key *pk, const struct persist_val *pv, const struct svc_val *svc)
{
	struct persist_val *old;
	struct sync_conn *e;
	__u64 every;

	if (!xlb_sync_on)
		return 0;
	old = bpf_map_lookup_elem(&xlb_persist, pk);
	every = (__u64)svc->persist_ttl * 1000000000ULL / 3;
	if (every < 1000000000ULL)
		every = 1000000000ULL;
	if (old && addr_eq(old->addr, pv->addr) && old->port == pv->port &&
	    old->seen / every == pv->seen / every)
		return 0;
	e = bpf_ringbuf_reserve(&xlb_sync, sizeof(*e), 0);
	if (!e) {
		__sync_fetch_and_add(&xlb_sync_lost, 1);
		return 0;
	}
	__builtin_memcpy(e->client, pk->src, 16);
	__builtin_memcpy(e->vip, pk->svc.addr, 16);
	__builtin_memcpy(e->backend, pv->addr, 16);
	__builtin_memset(e->reply, 0, 16);
	e->cport = pk->sport;
	e->vport = pk->svc.port;
	e->bport = pv->port;
	e->rport = 0;
	e->kind = XLB_SYNC_SESSION;
	e->proto = pk->svc.proto;
	/* Without the tag of a farm chosen by source table: tags are this
	 * node's (the peer steers the client again, sync_steer()). */
	e->family = pk->svc.family & ((1 << XLB_TBL_SIZE_SVC_TAG_SHIFT) - 1);
	e->state = 0;
	e->left = svc->persist_ttl;
	e->rc = 0;
	e->pad = 0;
	sync_submit(e);
	return 0;
}

/**
 * sync_steer() - the service of key @sk (a peer's record's VIP, port,
 * protocol, untagged) for client @client of family @family, as
 * svc_lookup() chooses it for a packet: where farms chosen by source table
 * share the key, the one whose table holds the client here (the same farm
 * as on the peer while both nodes have the same tables; the farm's tag is
 * this node's), else the key's own. @sk keeps the key matched. A client of
 * all zeros (a session whose persistence does not key on the client's
 * address) is not steered: the key's own farm.
 * Return: the service, or NULL.
 */
static __always_inline struct svc_val *sync_steer(struct svc_key *sk, const __u32 *client,
						  __u8 family)
{
	struct pkt p = {};

	if (!(client[0] | client[1] | client[2] | client[3]))
		return bpf_map_lookup_elem(&xlb_services, sk);
	__builtin_memcpy(p.k.src, client, 16);
	p.k.family = family;
	return svc_lookup(&p, sk);
}

/**
 * sync_install_session() - put a peer's persistence session @c into
 * xlb_persist, so the client's next new flow here goes to the backend the
 * peer chose (lb4_persistent(): while the backend serves the service here).
 * It has the time left that it had there; one here that is younger stands
 * (the client's newer choice). The service must persist here: the key is
 * the service's as the peer matched it, which the same farms on every node
 * make the same.
 * Return: an enum xlb_sync_rc value.
 */
static __attribute__((noinline)) int sync_install_session(const struct sync_conn *c, __u64 now)
{
	struct persist_key pk = {};
	struct persist_val pv = {}, *old;
	struct svc_val *svc;
	__u64 ttl, l;

	__builtin_memcpy(pk.svc.addr, c->vip, 16);
	pk.svc.port = c->vport;
	pk.svc.proto = c->proto;
	pk.svc.family = c->family;
	__builtin_memcpy(pk.src, c->client, 16);
	pk.sport = c->cport;
	svc = sync_steer(&pk.svc, c->client, c->family);
	if (!svc || !svc->persist)
		return XLB_SYNC_RC_NOPERSIST;
	__builtin_memcpy(pv.addr, c->backend, 16);
	pv.port = c->bport;
	ttl = (__u64)svc->persist_ttl * 1000000000ULL;
	l = (__u64)c->left * 1000000000ULL;
	pv.seen = c->left && l < ttl ? now - (ttl - l) : now;
	old = bpf_map_lookup_elem(&xlb_persist, &pk);
	if (old && (__s64)(old->seen - pv.seen) > 0)
		return XLB_SYNC_RC_OK;
	if (bpf_map_update_elem(&xlb_persist, &pk, &pv, BPF_ANY))
		return XLB_SYNC_RC_ERROR;
	return XLB_SYNC_RC_OK;
}

/* sync_seen() - the timestamp that leaves an entry in @state @left seconds
 * before it idles out (0: a whole timeout). */
static __always_inline __u64 sync_seen(__u8 state, __u32 left, __u64 now)
{
	__u64 to = ct_timeout(state), l = (__u64)left * 1000000000ULL;

	if (!left || l >= to)
		return now;
	return now - (to - l);
}

/* sync_same() - whether forward entry @v translates as @nv does. */
static __always_inline int sync_same(const struct ct_val *v, const struct ct_val *nv)
{
	return addr_eq(v->dst, nv->dst) && addr_eq(v->src, nv->src) && v->sport == nv->sport &&
	       v->dport == nv->dport;
}

/* sync_table_values() - the mark and DSCP this node's tables give flow
 * @k's client for its farm (tbl_client_values(): the mark in the low 32
 * bits, the DSCP above), found as a packet of the flow finds them.
 * Not inlined, and called from sync_install()'s frame (after sync_bind()
 * returned, never from within it): the deepest chain of calls stays within
 * the verifier's 512 bytes of stack. Only for an entry sync_bind() runs for
 * (its mark used where the backend has none): updates of bound flows and
 * ends need none. */
static __attribute__((noinline)) __u64 sync_table_values(const struct ct_key *k)
{
	__u32 conf = tbl_conf();
	struct pkt p = {};

	if (!(conf & XLB_TBL_CONF_ANY))
		return 0;
	__builtin_memcpy(&p.k, k, sizeof(p.k));
	return tbl_client_values(&p, conf);
}

/**
 * sync_bind() - give forward entry @v of flow @k this node's service
 * generation and backend ids: the service by VIP, port and protocol (and,
 * where farms chosen by source table share them, the client: sync_steer()), the
 * backend by its address and port in that service's current generation
 * (xlb_be_index); a peer's ids mean nothing here. Without such a farm here
 * (not configured yet: a node that joins may get its peers' state before
 * its own farms) the ids stay 0: the entry still carries the flow (its
 * translation is all in the entry, as in the kernel's conntrack), only it
 * is counted under no backend until an update binds it. A bound entry
 * gets its backend's mark (0 if it has none: the caller then gives it the
 * table's, sync_table_values()).
 * Return: XLB_SYNC_RC_OK, XLB_SYNC_RC_UNBOUND, or XLB_SYNC_RC_MODE for a
 * service here that keeps no state (dsr, stlsdnat).
 */
static __attribute__((noinline)) int sync_bind(const struct ct_key *k, struct ct_val *v)
{
	struct be_index_key bk = {};
	struct svc_key sk = {};
	struct svc_val *svc;
	struct backend *be;
	__u32 *bid;

	__builtin_memcpy(sk.addr, k->dst, 16);
	sk.port = k->dport;
	sk.proto = k->proto;
	sk.family = k->family;
	svc = sync_steer(&sk, k->src, k->family);
	if (!svc) {
		sk.port = 0;
		sk.family = k->family;
		svc = sync_steer(&sk, k->src, k->family);
		if (!svc)
			return XLB_SYNC_RC_UNBOUND;
	}
	if (!sync_mode(svc->mode))
		return XLB_SYNC_RC_MODE;
	bk.svc = svc->id;
	__builtin_memcpy(bk.addr, v->dst, 16);
	bk.port = v->dport;
	bid = bpf_map_lookup_elem(&xlb_be_index, &bk);
	if (!bid) {
		bk.port = 0; /* a backend without a port of its own */
		bid = bpf_map_lookup_elem(&xlb_be_index, &bk);
		if (!bid)
			return XLB_SYNC_RC_UNBOUND;
	}
	v->svc = svc->id;
	v->backend = *bid;
	/* The flow's mark as a new flow here gets it (lb4_new_flow()): this
	 * node's backend's, else (the caller's) what this node's mark tables
	 * give the client (a peer's mark may be one of its own making, e.g. the
	 * nft plane's backend ids, so it is not taken from the record). */
	be = bpf_map_lookup_elem(&xlb_backends, bid);
	v->mark = be ? be->mark : 0;
	return XLB_SYNC_RC_OK;
}

/**
 * sync_rebind() - bind forward entry @v of flow @k, installed unbound, once
 * its farm is here (sync_bind(); without a backend's mark, the table's),
 * counting it active as sync_insert() does.
 * Return: XLB_SYNC_RC_OK if @v is bound, else XLB_SYNC_RC_UNBOUND.
 */
static __always_inline int sync_rebind(const struct ct_key *k, struct ct_val *v)
{
	__u64 vals;

	if (v->backend)
		return XLB_SYNC_RC_OK;
	if (sync_bind(k, v) != XLB_SYNC_RC_OK)
		return XLB_SYNC_RC_UNBOUND;
	vals = sync_table_values(k);
	if (!v->mark)
		v->mark = (__u32)vals;
	v->dscp = vals >> 32;
	if (k->proto == IPPROTO_TCP && lc_counted(v->state))
		lc_add(v->backend, 1);
	return XLB_SYNC_RC_OK;
}

/**
 * sync_update() - a peer's news of a flow this node has (forward entry
 * (@k, @v), bound as far as it can be: @rc, sync_rebind()'s): its TCP state
 * moves forward only (a peer that saw less of the flow does not take it
 * back), its timestamp only later; a missing reply entry is recreated.
 * Return: @rc.
 */
static __attribute__((noinline)) int sync_update(const struct ct_key *k, struct ct_val *v,
						 const struct ct_val *nv, int rc)
{
	struct ct_val pv = {}, *peer;
	struct ct_key pk;

	if (k->proto == IPPROTO_TCP && nv->state > v->state && nv->state <= XLB_CT_STATE_CLOSE)
		lc_set_state(v, nv->state);
	if ((__s64)(nv->seen - v->seen) > 0)
		v->seen = nv->seen;
	ct_peer(k, v, &pk, &pv);
	peer = bpf_map_lookup_elem(&xlb_ct, &pk);
	if (!peer) {
		bpf_map_update_elem(&xlb_ct, &pk, &pv, BPF_NOEXIST);
		return rc;
	}
	if (peer->dir == XLB_CT_REPLY) {
		peer->state = v->state;
		peer->svc = v->svc;
		peer->backend = v->backend;
		peer->mark = v->mark;
		peer->dscp = v->dscp;
		if ((__s64)(v->seen - peer->seen) > 0)
			peer->seen = v->seen;
	}
	return rc;
}

/**
 * sync_insert() - write both entries of the new flow (@k, @v): the reply
 * entry first (for snat, its key is the source port the peer allocated:
 * another flow's here is a conflict), then the forward entry, counted
 * active as lb4_new_flow() counts it if it is bound (@rc, sync_bind()'s).
 * Return: an enum xlb_sync_rc value.
 */
static __attribute__((noinline)) int sync_insert(const struct ct_key *k, const struct ct_val *v,
						 int rc)
{
	struct ct_val pv = {}, *old;
	struct ct_key pk;

	ct_peer(k, v, &pk, &pv);
	if (bpf_map_update_elem(&xlb_ct, &pk, &pv, BPF_NOEXIST)) {
		old = bpf_map_lookup_elem(&xlb_ct, &pk);
		if (!old)
			return XLB_SYNC_RC_ERROR;
		/* The flow's own reply entry (its forward entry was evicted)
		 * is taken over; another flow's is not. */
		if (old->dir != XLB_CT_REPLY || !addr_eq(old->dst, k->src) ||
		    !addr_eq(old->src, k->dst) || old->dport != k->sport || old->sport != k->dport)
			return XLB_SYNC_RC_CONFLICT;
		old->state = v->state;
		old->seen = v->seen;
		old->svc = v->svc;
		old->backend = v->backend;
		old->mark = v->mark;
		old->dscp = v->dscp;
	}
	if (bpf_map_update_elem(&xlb_ct, k, v, BPF_NOEXIST))
		/* A packet created it meanwhile: that one stands. */
		return bpf_map_lookup_elem(&xlb_ct, k) ? XLB_SYNC_RC_OK : XLB_SYNC_RC_ERROR;
	if (rc == XLB_SYNC_RC_OK && k->proto == IPPROTO_TCP && lc_counted(v->state))
		lc_add(v->backend, 1);
	return rc;
}

/* sync_warm() - look up the reply entry of flow (@k, @v), result unused,
 * just before sync_install() looks up the forward one: both buckets of a
 * new flow are cold (a random spot of a large table), and the CPU fetches
 * the second while it waits for the first (the lookup's chain walk is
 * predicted empty), so the reply entry's insert finds its bucket in the
 * cache. Not inlined: its key's stack is free again before the deepest
 * chain of calls. */
static __attribute__((noinline)) void sync_warm(const struct ct_key *k, const struct ct_val *v)
{
	struct ct_key pk;

	ct_peer_key(k, v, &pk);
	bpf_map_lookup_elem(&xlb_ct, &pk);
}

/**
 * sync_install() - put a peer's connection @c into xlb_ct (new or update),
 * or take it out (end); a session goes to sync_install_session().
 *
 * Its forward entry is keyed as the client sent it; the translation is the
 * peer's (for snat, the peer's source address and port: the backend answers
 * there). A flow here with the same translation is updated
 * (sync_update()); one with another is replaced by the news of a new
 * connection (or a dump, which sends every flow as new), not by an update
 * (a stale one must not take a live flow's place), and a closed one by a
 * new connection. The service and the
 * backend ids are this node's (sync_bind()).
 * Return: an enum xlb_sync_rc value.
 */
static __attribute__((noinline)) int sync_install(const struct sync_conn *c, __u64 now)
{
	struct ct_key fk = {};
	struct ct_val fv = {}, *v;
	__u64 vals;
	int rc;

	if (c->kind == XLB_SYNC_SESSION &&
	    (c->family == XLB_AF_INET || c->family == XLB_AF_INET6) &&
	    (c->proto == IPPROTO_TCP || c->proto == IPPROTO_UDP))
		return sync_install_session(c, now);
	if (c->kind < XLB_SYNC_NEW || c->kind > XLB_SYNC_END ||
	    (c->family != XLB_AF_INET && c->family != XLB_AF_INET6) ||
	    (c->proto != IPPROTO_TCP && c->proto != IPPROTO_UDP) ||
	    (c->proto == IPPROTO_TCP && c->state > XLB_CT_STATE_CLOSE))
		return XLB_SYNC_RC_BAD;
	__builtin_memcpy(fk.src, c->client, 16);
	__builtin_memcpy(fk.dst, c->vip, 16);
	fk.sport = c->cport;
	fk.dport = c->vport;
	fk.proto = c->proto;
	fk.family = c->family;

	__builtin_memcpy(fv.src, c->reply, 16);
	__builtin_memcpy(fv.dst, c->backend, 16);
	fv.sport = c->rport;
	fv.dport = c->bport;
	fv.dir = XLB_CT_FWD;
	fv.state = c->proto == IPPROTO_TCP ? c->state : XLB_CT_STATE_UDP;
	fv.mode = addr_eq(c->reply, c->client) && c->rport == c->cport ? XLB_MODE_DNAT
								       : XLB_MODE_SNAT;
	fv.seen = sync_seen(fv.state, c->left, now);

	sync_warm(&fk, &fv);
	v = bpf_map_lookup_elem(&xlb_ct, &fk);
	if (v) {
		if (v->dir != XLB_CT_FWD)
			return XLB_SYNC_RC_CONFLICT;
		if (sync_same(v, &fv)) {
			if (c->kind == XLB_SYNC_END) {
				ct_delete(&fk, v);
				return XLB_SYNC_RC_OK;
			}
			if (c->kind != XLB_SYNC_NEW || v->state < XLB_CT_STATE_FIN ||
			    fv.state >= XLB_CT_STATE_FIN)
				return sync_update(&fk, v, &fv, sync_rebind(&fk, v));
		} else if (c->kind == XLB_SYNC_END) {
			return XLB_SYNC_RC_GONE;
		} else if (c->kind == XLB_SYNC_UPDATE) {
			/* Another connection on the tuple here: only the news
			 * of a new one (or a dump) replaces it, never a stale
			 * update of an older one. */
			return XLB_SYNC_RC_CONFLICT;
		}
		ct_delete(&fk, v);
	}
	if (c->kind == XLB_SYNC_END)
		return XLB_SYNC_RC_GONE;
	rc = sync_bind(&fk, &fv);
	if (rc == XLB_SYNC_RC_MODE)
		return rc;
	/* The table's mark where the backend has none, and its DSCP (for an
	 * entry installed unbound too: what a packet of the flow would get
	 * here; the peer's record carries neither). */
	vals = sync_table_values(&fk);
	if (!fv.mark)
		fv.mark = (__u32)vals;
	fv.dscp = vals >> 32;
	return sync_insert(&fk, &fv, rc);
}

/* xlb_ct_install()'s state across its bpf_loop() steps. */
struct sync_run {
	__u64 now;
	__u32 done;
	__u32 pad;
};

/* sync_install_step() - element @i of xlb_sync_in. */
static long sync_install_step(__u64 i, void *ctx)
{
	struct sync_run *r = ctx;
	__u32 idx = (__u32)i;
	struct sync_conn *c = bpf_map_lookup_elem(&xlb_sync_in, &idx);

	if (!c)
		return 1;
	c->rc = sync_install(c, r->now);
	if (c->rc == XLB_SYNC_RC_OK || c->rc == XLB_SYNC_RC_UNBOUND)
		r->done++;
	return 0;
}

/* The context of xlb_ct_install. */
struct sync_args {
	__u32 n; /* elements of xlb_sync_in to take */
	__u32 pad;
	__u64 now; /* CLOCK_MONOTONIC_COARSE in ns, the conntrack clock (xlb_now() is
		    * not open to syscall programs: no coarse-clock helper there) */
};

/**
 * xlb_ct_install() - install elements 0..n-1 of xlb_sync_in (a peer's
 * connections, sync_install()), writing each one's rc. Never attached; the
 * loader runs it with BPF_PROG_TEST_RUN once per batch
 * (Plane.InstallConns).
 * Return: how many were installed, updated or removed; -1 if n is larger
 * than XLB_SYNC_BATCH.
 */
SEC("syscall")
int xlb_ct_install(struct sync_args *ctx)
{
	struct sync_run r = { .now = ctx->now };
	__u32 n = ctx->n;

	if (n > XLB_SYNC_BATCH)
		return -1;
	bpf_loop(n, sync_install_step, &r, 0);
	return r.done;
}

#endif /* XLB_SYNC_H */
