//go:build ignore

/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* xlb's tcx ingress program: layer-4 load balancing with full NAT both ways
 * (dnat, snat, dsr and stlsdnat modes) for TCP and UDP over IPv4 and IPv6.
 * See docs/dataplane-ebpf.md.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "xlb_consts.h"
#include "xlb_structs.h"
#include "xlb_maps.h"
#include "xlb_parsing.h"
#include "xlb_csum.h"
/* lb4_pick() tells the peers of its persistence sessions (xlb_sync.h). */
#define XLB_SYNC_SESSIONS
#include "xlb_pick.h"
#include "xlb_tables.h"
#include "xlb_climit.h"

#define AF_INET 2
#define AF_INET6 10

char __license[] SEC("license") = "Dual BSD/GPL";

/* Never read: a variable of struct xlb_enums puts every enum shared with Go
 * into the object's BTF, where bpf2go finds them (xlb_consts.h). */
const struct xlb_enums *xlb_enums_btf __attribute__((unused));

/* Idle timeouts per conntrack state, in ns. Set by the loader before the
 * program is loaded (Options.Timeouts); the verifier sees constants. The
 * defaults are IPVS's: tcp 900 s, tcpfin 120 s, udp 300 s (ipvsadm --set),
 * SYN_RECV 60 s, CLOSE 10 s. */
volatile const __u64 xlb_timeout_syn = 60000000000ULL;
volatile const __u64 xlb_timeout_tcp = 900000000000ULL;
volatile const __u64 xlb_timeout_fin = 120000000000ULL;
volatile const __u64 xlb_timeout_close = 10000000000ULL;
volatile const __u64 xlb_timeout_udp = 300000000000ULL;

/* How often a live entry refreshes its timestamp, checks its peer and
 * re-resolves its next hop (XLB_CT_REFRESH_NS; benchmarks raise it to keep
 * the FIB out of the conntrack-hit measurement). */
volatile const __u64 xlb_ct_refresh_ns = XLB_CT_REFRESH_NS;

/*
 * The conntrack clock: CLOCK_MONOTONIC_COARSE in ns, from jiffies.
 *
 * Every packet of a tracked flow needs the time (is its entry due for a
 * refresh?). bpf_ktime_get_coarse_ns() is a helper call, and with the
 * kernel's return-thunk mitigations (spec_rstack_overflow: Safe RET on
 * AMD) a call costs about 20 ns: a fifth of a conntrack hit
 * (BPF_PROG_TEST_RUN). bpf_jiffies64() is inlined by the verifier into one
 * load, and the coarse clock moves only at a tick anyway, so
 * jiffies * tick + offset is the same clock at the same resolution.
 *
 * The loader measures the tick length and the offset once, with
 * xlb_clock_sample (Plane.calibrateClock), and sets both; until then, or if
 * it cannot, xlb_clock_tick_ns is 0 and the helper is called. Timestamps
 * stay CLOCK_MONOTONIC_COARSE, so entries written by an earlier program
 * (a restart, an upgrade) compare correctly. Offsets of two loads may
 * differ by a tick: time comparisons are signed (xlb_elapsed), so a
 * timestamp slightly in the future counts as "just now".
 */
volatile __u64 xlb_clock_tick_ns = 0;
volatile __u64 xlb_clock_offset = 0;

static __always_inline __u64 xlb_now(void)
{
	__u64 tick = xlb_clock_tick_ns;

	if (!tick)
		return bpf_ktime_get_coarse_ns();
	return bpf_jiffies64() * tick + xlb_clock_offset;
}

/* The source ports of this node's snat flows (host order; Options.SNATPorts,
 * --snat-ports): nodes that share a farm's source address take disjoint
 * ranges, so two nodes never give two connections the same (source address,
 * port) towards a backend (docs/ha.md). A client's own port is kept when it
 * is in the range and free. */
volatile const __u32 xlb_snat_port_min = XLB_SNAT_PORT_MIN;
volatile const __u32 xlb_snat_port_max = 65535;

/* snat_port() - a random port of the snat range, network order. */
static __always_inline __u16 snat_port(void)
{
	return bpf_htons(xlb_snat_port_min +
			 bpf_get_prandom_u32() % (xlb_snat_port_max - xlb_snat_port_min + 1));
}

/* XDP fast path: 1 when it runs in generic mode, where a redirect to any
 * interface works (the frame is an skb); 0 in native mode, where it
 * redirects only to interfaces in xlb_xdp_tx. Set by the loader. */
volatile const __u32 xlb_xdp_any_tx = 0;

/* Returned by lb4_ct_hit() when the entry is gone (expired, or a new
 * connection reuses the tuple): schedule the packet as a new flow. */
#define XLB_CT_MISS (-100)

/**
 * be_count() - count a packet of a flow of backend @bid in xlb_be_stats.
 * @bid: backend id (backends without a counter slot, e.g. removed ones, are
 *       not counted)
 * @dir: XLB_CT_FWD (client -> backend, "in") or XLB_CT_REPLY ("out")
 * @len: skb->len, with the Ethernet header
 * @conn: 1 on a new connection's first packet
 */
static __always_inline void be_count(__u32 bid, __u8 dir, __u32 len, int conn)
{
	__u32 *fl = bpf_map_lookup_elem(&xlb_be_flags, &bid);
	struct be_stats *s;
	__u32 slot;

	if (!fl)
		return;
	slot = *fl >> XLB_BE_SLOT_SHIFT;
	if (!slot)
		return;
	s = bpf_map_lookup_elem(&xlb_be_stats, &slot);
	if (!s)
		return;
	len = len > ETH_HLEN ? len - ETH_HLEN : 0;
	if (dir == XLB_CT_FWD) {
		s->conns += conn;
		s->in_pkts++;
		s->in_bytes += len;
	} else {
		s->out_pkts++;
		s->out_bytes += len;
	}
}

/**
 * lb_log() - emit a conn_event for the new flow @fv (of packet @p, to
 * backend @be) if its farm logs connections (XLB_SVC_F_LOG). A full ring
 * buffer loses the record (log_lost). Not inlined: its stack stays out of
 * the new-flow path's.
 * Return: 0.
 */
static __attribute__((noinline)) int lb_log(struct pkt *p, struct ct_val *fv, struct backend *be)
{
	__u32 sid = fv->svc;
	__u32 *fl = bpf_map_lookup_elem(&xlb_svc_flags, &sid);
	struct conn_event *e;

	if (!fl || !(*fl & XLB_SVC_F_LOG))
		return 0;
	e = bpf_ringbuf_reserve(&xlb_events, sizeof(*e), 0);
	if (!e) {
		stat_inc(XLB_STAT_LOG_LOST);
		return 0;
	}
	e->svc = sid;
	e->backend = fv->backend;
	__builtin_memcpy(e->src, p->k.src, 16);
	__builtin_memcpy(e->vip, p->k.dst, 16);
	__builtin_memcpy(e->dst, be->addr, 16);
	e->sport = p->k.sport;
	e->vport = p->k.dport;
	e->dport = be->port ?: p->k.dport;
	e->proto = p->k.proto;
	e->family = p->k.family;
	e->ts = bpf_ktime_get_coarse_ns();
	bpf_ringbuf_submit(e, 0);
	return 0;
}

/* ct_peer_key() - the key of the other direction of entry (k, v). */
static __always_inline void ct_peer_key(const struct ct_key *k, const struct ct_val *v,
					struct ct_key *pk)
{
	__builtin_memcpy(pk->src, v->dst, sizeof(pk->src));
	__builtin_memcpy(pk->dst, v->src, sizeof(pk->dst));
	pk->sport = v->dport;
	pk->dport = v->sport;
	pk->proto = k->proto;
	pk->family = k->family;
	pk->pad = 0;
}

/* ct_peer() - the key and value of the other direction of entry (k, v). */
static __always_inline void ct_peer(const struct ct_key *k, const struct ct_val *v,
				    struct ct_key *pk, struct ct_val *pv)
{
	__builtin_memcpy(pk->src, v->dst, sizeof(pk->src));
	__builtin_memcpy(pk->dst, v->src, sizeof(pk->dst));
	pk->sport = v->dport;
	pk->dport = v->sport;
	pk->proto = k->proto;
	pk->family = k->family;
	pk->pad = 0;

	__builtin_memcpy(pv->src, k->dst, sizeof(pv->src));
	__builtin_memcpy(pv->dst, k->src, sizeof(pv->dst));
	pv->sport = k->dport;
	pv->dport = k->sport;
	pv->dir = v->dir == XLB_CT_FWD ? XLB_CT_REPLY : XLB_CT_FWD;
	pv->state = v->state;
	pv->mode = v->mode;
	pv->nh_flags = 0;
	pv->svc = v->svc;
	pv->backend = v->backend;
	pv->seen = v->seen;
	pv->ifindex = 0;
	pv->mark = v->mark;
	pv->dscp = v->dscp;
	/* Byte by byte: a memset cost xlb_ingress 8 more bytes of stack. */
	pv->pad[0] = 0;
	pv->pad[1] = 0;
	pv->pad[2] = 0;
}

#include "xlb_passive.h"

static __always_inline __u64 ct_timeout(__u8 state)
{
	switch (state) {
	case XLB_CT_STATE_SYN:
		return xlb_timeout_syn;
	case XLB_CT_STATE_EST:
		return xlb_timeout_tcp;
	case XLB_CT_STATE_FIN:
		return xlb_timeout_fin;
	case XLB_CT_STATE_CLOSE:
		return xlb_timeout_close;
	default:
		return xlb_timeout_udp;
	}
}

/* ct_next_state() - the state a TCP flow in @s moves to on a packet with
 * @flags (either direction). */
static __always_inline __u8 ct_next_state(__u8 s, __u8 flags)
{
	if (flags & XLB_TCP_RST)
		return XLB_CT_STATE_CLOSE;
	if (flags & XLB_TCP_FIN)
		return s == XLB_CT_STATE_CLOSE ? s : XLB_CT_STATE_FIN;
	if (s == XLB_CT_STATE_SYN && (flags & (XLB_TCP_SYN | XLB_TCP_ACK)) == XLB_TCP_ACK)
		return XLB_CT_STATE_EST;
	return s;
}

/* ct_delete() - remove both entries of the flow of (k, v), its forward
 * entry first taken out of the active count (xlb_lc.h). */
static __always_inline void ct_delete(const struct ct_key *k, struct ct_val *v)
{
	struct ct_val *fv = v;
	struct ct_key pk;

	ct_peer_key(k, v, &pk);
	if (v->dir != XLB_CT_FWD)
		fv = bpf_map_lookup_elem(&xlb_ct, &pk);
	if (fv && fv->dir == XLB_CT_FWD)
		lc_set_state(fv, XLB_CT_STATE_CLOSE);
	bpf_map_delete_elem(&xlb_ct, &pk);
	bpf_map_delete_elem(&xlb_ct, k);
}

/* ct_put_state() - set entry @v's state; the forward entry's through
 * lc_set_state(), which keeps the active count. */
static __always_inline void ct_put_state(struct ct_val *v, __u8 state)
{
	if (v->dir == XLB_CT_FWD)
		lc_set_state(v, state);
	else
		v->state = state;
}

/**
 * ct_expired() - whether the flow of (k, v) has been idle longer than its
 * state's timeout. A direction carrying no packets (one-way UDP) does not
 * expire while its peer is live, so the peer is asked before giving up.
 */
static __always_inline int ct_expired(const struct ct_key *k, const struct ct_val *v, __u64 now)
{
	__u64 to = ct_timeout(v->state);
	struct ct_key pk;
	struct ct_val *peer;

	if (xlb_elapsed(now, v->seen) <= to)
		return 0;
	ct_peer_key(k, v, &pk);
	peer = bpf_map_lookup_elem(&xlb_ct, &pk);
	return !peer || xlb_elapsed(now, peer->seen) > to;
}

/* ct_set_state() - move the flow of (k, v) to @state, in both entries. */
static __always_inline void ct_set_state(const struct ct_key *k, struct ct_val *v, __u8 state,
					 __u64 now)
{
	struct ct_key pk;
	struct ct_val *peer;

	ct_put_state(v, state);
	v->seen = now;
	ct_peer_key(k, v, &pk);
	peer = bpf_map_lookup_elem(&xlb_ct, &pk);
	if (peer) {
		ct_put_state(peer, state);
		peer->seen = now;
	}
}

/**
 * ct_refresh() - periodic upkeep of a live entry: make sure its peer (the
 * other direction) still exists, recreating it from this one if the LRU
 * evicted it. The lookup also marks the peer as used, so both directions of
 * a flow age together even when only one direction carries packets.
 */
static __always_inline void ct_refresh(const struct ct_key *k, struct ct_val *v, __u64 now)
{
	struct ct_key pk;
	struct ct_val pv = {};

	v->seen = now;
	if (v->mode == XLB_MODE_DSR)
		return; /* no reply entry: replies do not pass through us */
	ct_peer(k, v, &pk, &pv);
	if (bpf_map_lookup_elem(&xlb_ct, &pk))
		return;
	if (bpf_map_update_elem(&xlb_ct, &pk, &pv, BPF_NOEXIST) == 0)
		stat_inc(XLB_STAT_PEER_REPAIR);
}

#include "xlb_sync.h"

/**
 * lb_redirect() - send a rewritten packet to the next hop cached in @v.
 *
 * A veth or netkit interface whose peer is in another namespace (a
 * container's, a pod's: XLB_NH_F_PEER, from xlb_peer_tx) gets
 * bpf_redirect_peer(): the packet goes straight to the peer's ingress, in
 * the same softirq pass, without the transmit (qdisc, veth_xmit, the
 * backlog queue and a second receive pass). Any other interface (a physical
 * NIC, a bridge, a veth whose peer is in this namespace) gets bpf_redirect(),
 * since the kernel drops a peer redirect there.
 * Return: XLB_REDIRECT.
 */
static __always_inline int lb_redirect(const struct ct_val *v)
{
	__u32 ifindex = v->ifindex;

	if (v->nh_flags & XLB_NH_F_PEER) {
		stat_inc(XLB_STAT_FIB_PEER);
		return bpf_redirect_peer(ifindex, 0);
	}
	stat_inc(XLB_STAT_FIB_REDIRECT);
	return bpf_redirect(ifindex, 0);
}

/**
 * lb_bridge_port() - the bridge port behind which @mac sits, if @bridge is
 * a bridge whose forwarding database the loader mirrors in xlb_br_port
 * (--bridge-port-redirect) and the port takes a peer redirect.
 * Return: the port's ifindex, or 0.
 */
static __always_inline __u32 lb_bridge_port(__u32 bridge, const __u8 *mac)
{
	struct br_port_key k = { .bridge = bridge };
	__u32 *port;

	__builtin_memcpy(k.mac, mac, 6);
	port = bpf_map_lookup_elem(&xlb_br_port, &k);
	if (!port || !bpf_map_lookup_elem(&xlb_peer_tx, port))
		return 0;
	return *port;
}

/**
 * lb_set_dscp() - give the IPv4 or IPv6 (@family) packet @skb the DSCP
 * @dscp, ECN kept (ip4_set_dscp(), ip6_set_dscp()). Not inlined: called
 * only for flows with a DSCP, its stack stays out of xlb_ingress's frame,
 * which is on the verifier's deepest chain of calls (512 bytes).
 * Return: 0, or -1 when the packet is too short.
 */
static __attribute__((noinline)) int lb_set_dscp(struct __sk_buff *skb, __u32 family, __u32 dscp)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;

	if (family == XLB_AF_INET6) {
		struct xlb_ipv6hdr *ip6 = data + sizeof(struct ethhdr);

		if ((void *)(ip6 + 1) > end)
			return -1;
		ip6_set_dscp(ip6, dscp);
		return 0;
	}
	struct iphdr *ip = data + sizeof(struct ethhdr);

	if ((void *)(ip + 1) > end)
		return -1;
	ip4_set_dscp(ip, dscp);
	return 0;
}

/**
 * lb4_nat() - rewrite a packet to @v's tuple and send it on.
 * @skb: the packet
 * @p: its parsed tuple
 * @v: conntrack entry; its cached next hop is used, or filled
 * @fresh: ignore the cached next hop and resolve it again
 *
 * The next hop (interface and MACs) is cached in the entry, so a packet of a
 * tracked flow costs no FIB lookup; it is resolved on a flow's first packet
 * and again whenever the entry is refreshed (xlb_ct_refresh_ns). Whether
 * the interface takes a peer redirect (xlb_peer_tx) is cached with it.
 *
 * Return: XLB_REDIRECT (bpf_redirect_peer or bpf_redirect, see
 * lb_redirect(); bpf_redirect_neigh when the neighbour is not resolved
 * yet), XLB_PASS when the TTL expires or the FIB
 * has no forwarding answer (the stack handles the rewritten packet),
 * XLB_DROP for blackhole/unreachable/prohibit routes or errors.
 */
static __always_inline int lb4_nat(struct __sk_buff *skb, struct pkt *p, struct ct_val *v,
				   int fresh)
{
	struct bpf_fib_lookup fib = {};
	struct bpf_redir_neigh nh = {};
	const __u32 *dst;
	__u32 ifindex, flags = 0;
	int rc;

	/* The flow's mark (the nft plane's ct mark): on every packet, for
	 * the stack and the egress hooks it goes through (policy routing of
	 * a passed packet, the user's egress rules, tc egress). */
	if (v->mark)
		skb->mark = v->mark;
	/* The flow's DSCP (a dscp table's value), on the client's packets
	 * only (a reply entry carries it for the forward one's sake). Before
	 * lb4_rewrite(), which reads the packet's pointers afresh. */
	if (v->dscp && v->dir == XLB_CT_FWD && lb_set_dscp(skb, p->k.family, v->dscp))
		goto err;
	if (p->ttl <= 1) {
		stat_inc(XLB_STAT_FIB_PASS);
		goto pass; /* the stack sends ICMP time exceeded */
	}
	if (v->ifindex && !fresh) {
		if (lb4_rewrite(skb, p, v, v->dmac, v->smac))
			goto err;
		return lb_redirect(v);
	}

	ifindex = skb->ingress_ifindex ?: skb->ifindex;
	fib.l4_protocol = p->k.proto;
	fib.sport = v->sport;
	fib.dport = v->dport;
	fib.tot_len = 0; /* no MTU check here: the stack's on the way out */
	fib.ifindex = ifindex;
	/* dsr: the packet keeps the VIP; its next hop is the backend. */
	dst = v->dst;
	if (v->mode == XLB_MODE_DSR) {
		__u32 bid = v->backend;
		struct backend *be = bpf_map_lookup_elem(&xlb_backends, &bid);

		if (!be)
			goto err;
		dst = be->addr;
		__builtin_memcpy(nh.ipv6_nh, be->addr, 16);
	}
	if (p->k.family == XLB_AF_INET6) {
		fib.family = AF_INET6;
		nh.nh_family = AF_INET6;
		__builtin_memcpy(fib.ipv6_src, v->src, 16);
		__builtin_memcpy(fib.ipv6_dst, dst, 16);
	} else {
		fib.family = AF_INET;
		nh.nh_family = AF_INET;
		fib.ipv4_src = v->src[0];
		fib.ipv4_dst = dst[0];
	}

	if (v->mark) {
		/* The route a marked flow takes is the one the user's
		 * fwmark rules give it (ip rule fwmark), as the stack routes
		 * the nft plane's marked packets. */
		__builtin_memcpy(fib.smac, &v->mark, 4); /* params->mark, see XLB_FIB_LOOKUP_MARK */
		flags = XLB_FIB_LOOKUP_MARK;
	}

	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), flags);
	switch (rc) {
	case BPF_FIB_LKUP_RET_SUCCESS:
		v->ifindex = 0;
		__builtin_memcpy(v->dmac, fib.dmac, 6);
		__builtin_memcpy(v->smac, fib.smac, 6);
		v->nh_flags = 0;
		/* A peer redirect skips this namespace's egress (where the
		 * mark is read) and keeps the mark into the peer's namespace
		 * (skb_scrub_packet without xnet), where a veth's transmit
		 * clears it: a marked flow is transmitted. */
		ifindex = v->mark ? 0 : lb_bridge_port(fib.ifindex, fib.dmac);
		if (ifindex)
			v->nh_flags = XLB_NH_F_PEER;
		else if (!v->mark && bpf_map_lookup_elem(&xlb_peer_tx, &fib.ifindex))
			v->nh_flags = XLB_NH_F_PEER;
		v->ifindex = ifindex ?: fib.ifindex;
		if (lb4_rewrite(skb, p, v, v->dmac, v->smac))
			goto err;
		return lb_redirect(v);
	case BPF_FIB_LKUP_RET_NO_NEIGH: {
		/* bpf_redirect_neigh() fills in the MACs later. */
		__u8 macs[12];
		void *data = (void *)(long)skb->data;

		if (data + 12 > (void *)(long)skb->data_end)
			goto err;
		__builtin_memcpy(macs, data, 12);
		v->ifindex = 0;
		if (lb4_rewrite(skb, p, v, macs, macs + 6))
			goto err;
		stat_inc(XLB_STAT_FIB_NEIGH);
		if (v->mode == XLB_MODE_DSR)
			return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
		return bpf_redirect_neigh(fib.ifindex, NULL, 0, 0);
	}
	case BPF_FIB_LKUP_RET_BLACKHOLE:
	case BPF_FIB_LKUP_RET_UNREACHABLE:
	case BPF_FIB_LKUP_RET_PROHIBIT:
		stat_inc(XLB_STAT_FIB_DROP);
		return XLB_DROP;
	default:
		stat_inc(XLB_STAT_FIB_PASS);
		goto pass;
	}
pass:
	if (lb4_rewrite(skb, p, v, NULL, NULL))
		goto err;
	return XLB_PASS;
err:
	stat_inc(XLB_STAT_ERROR);
	return XLB_DROP;
}

/* lb4_nat_call() - lb4_nat() in a frame of its own, for the new-flow path
 * (the conntrack-hit path inlines it; both inlined exceed the stack). */
static __attribute__((noinline)) int lb4_nat_call(struct __sk_buff *skb, struct pkt *p,
						  struct ct_val *v, int fresh)
{
	return lb4_nat(skb, p, v, fresh);
}

/**
 * lb4_stateless() - stlsdnat: translate a packet to a VIP without
 * conntrack. Every packet is scheduled (use a hash scheduler to keep a
 * connection on one backend) and its next hop resolved (no entry to cache
 * it in).
 */
static __attribute__((noinline)) int lb4_stateless(struct __sk_buff *skb, struct pkt *p,
						   struct svc_val *svc, struct svc_key *key)
{
	struct backend *be;
	struct scratch *sc;
	struct ct_val *fv;
	__u32 bid, zero = 0;

	if (svc->slots == 0) {
		stat_inc(XLB_STAT_NO_BACKEND);
		return XLB_DROP;
	}
	bid = lb4_pick(p, svc, key, xlb_now());
	be = bid ? bpf_map_lookup_elem(&xlb_backends, &bid) : NULL;
	if (!be) {
		stat_inc(XLB_STAT_NO_BACKEND);
		return XLB_DROP;
	}
	sc = bpf_map_lookup_elem(&xlb_scratch, &zero);
	if (!sc)
		return XLB_DROP;
	fv = &sc->rv; /* on no stack: the frames of this call chain fill it */
	__builtin_memset(fv, 0, sizeof(*fv));
	__builtin_memcpy(fv->src, p->k.src, 16);
	__builtin_memcpy(fv->dst, be->addr, 16);
	fv->sport = p->k.sport;
	fv->dport = be->port ?: p->k.dport;
	fv->mode = XLB_MODE_STLSDNAT;
	fv->backend = bid;
	/* The DSCP the policy check found for this packet (every packet of a
	 * stlsdnat farm is checked as a new flow's: tbl_check_new). */
	fv->dscp = tbl_flow_dscp(sc);
	stat_inc(XLB_STAT_STATELESS);
	be_count(bid, XLB_CT_FWD, skb->len, 0);
	return lb4_nat_call(skb, p, fv, 1);
}

/**
 * lb4_stateless_reply() - a packet for no VIP: if it comes from a backend
 * of a stlsdnat farm, give it the VIP as its source; otherwise it is not
 * ours.
 */
static __attribute__((noinline)) int lb4_stateless_reply(struct __sk_buff *skb, struct pkt *p)
{
	struct stl_key sk = {};
	struct stl_val *m;
	struct scratch *sc;
	struct ct_val *fv;
	__u32 zero = 0;

	__builtin_memcpy(sk.addr, p->k.src, 16);
	sk.port = p->k.sport;
	sk.proto = p->k.proto;
	sk.family = p->k.family;
	m = bpf_map_lookup_elem(&xlb_stateless, &sk);
	if (!m) {
		sk.port = 0;
		m = bpf_map_lookup_elem(&xlb_stateless, &sk);
	}
	if (!m) {
		stat_inc(XLB_STAT_NOT_VIP);
		return XLB_NEXT;
	}
	sc = bpf_map_lookup_elem(&xlb_scratch, &zero);
	if (!sc)
		return XLB_DROP;
	fv = &sc->rv;
	__builtin_memset(fv, 0, sizeof(*fv));
	__builtin_memcpy(fv->src, m->addr, 16);
	__builtin_memcpy(fv->dst, p->k.dst, 16);
	fv->sport = m->port ?: p->k.sport;
	fv->dport = p->k.dport;
	fv->mode = XLB_MODE_STLSDNAT;
	stat_inc(XLB_STAT_STATELESS);
	return lb4_nat_call(skb, p, fv, 1);
}

/* csum_fold() - the Internet checksum of a 32-bit sum (bpf_csum_diff's). */
static __always_inline __u16 csum_fold(__s64 sum)
{
	__u32 c = (__u32)sum;

	c = (c & 0xffff) + (c >> 16);
	c = (c & 0xffff) + (c >> 16);
	return ~c & 0xffff;
}

/**
 * lb4_reject() - lb_reject() for IPv4, quoting @quote bytes (IP header and
 * the first @quote - 20 bytes of L4; a constant after inlining).
 */
static __always_inline int lb4_reject(struct __sk_buff *skb, const __u32 quote)
{
	void *data, *end;
	struct iphdr *ip, *in;
	struct xlb_icmphdr *ic;
	__u32 saddr, daddr;
	__s64 sum;

	/* Trim to the quote (a shrink: a CHECKSUM_COMPLETE skb becomes
	 * CHECKSUM_NONE), then open room for the new headers after the
	 * Ethernet header. */
	if (bpf_skb_change_tail(skb, sizeof(struct ethhdr) + quote, 0) ||
	    bpf_skb_adjust_room(skb, sizeof(struct iphdr) + sizeof(struct xlb_icmphdr),
				BPF_ADJ_ROOM_MAC, 0))
		return XLB_DROP;
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	ip = data + sizeof(struct ethhdr);
	ic = (void *)(ip + 1);
	in = (void *)(ic + 1);
	if ((void *)in + quote > end)
		return XLB_DROP;
	saddr = in->daddr;
	daddr = in->saddr;
	ip->version = 4;
	ip->ihl = 5;
	ip->tos = 0;
	ip->tot_len = bpf_htons(sizeof(struct iphdr) + sizeof(struct xlb_icmphdr) + quote);
	ip->id = 0;
	ip->frag_off = 0;
	ip->ttl = 64;
	ip->protocol = IPPROTO_ICMP;
	ip->check = 0;
	ip->saddr = saddr;
	ip->daddr = daddr;
	ic->type = XLB_ICMP_DEST_UNREACH;
	ic->code = 3; /* port unreachable */
	ic->checksum = 0;
	ic->rest = 0;
	sum = bpf_csum_diff(NULL, 0, (void *)ip, sizeof(struct iphdr), 0);
	ip->check = csum_fold(sum);
	sum = bpf_csum_diff(NULL, 0, (void *)ic, sizeof(struct xlb_icmphdr) + quote, 0);
	ic->checksum = csum_fold(sum);
	return 0;
}

/**
 * lb6_reject() - lb_reject() for IPv6, quoting @quote bytes (IPv6 header
 * and the first @quote - 40 bytes of L4).
 */
static __always_inline int lb6_reject(struct __sk_buff *skb, const __u32 quote)
{
	__u32 pseudo[2] = { bpf_htonl(sizeof(struct xlb_icmphdr) + quote),
			    bpf_htonl(XLB_NEXTHDR_ICMPV6) };
	struct xlb_ipv6hdr *ip6, *in;
	struct xlb_icmphdr *ic;
	void *data, *end;
	__s64 sum;

	if (bpf_skb_change_tail(skb, sizeof(struct ethhdr) + quote, 0) ||
	    bpf_skb_adjust_room(skb, sizeof(struct xlb_ipv6hdr) + sizeof(struct xlb_icmphdr),
				BPF_ADJ_ROOM_MAC, 0))
		return XLB_DROP;
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	ip6 = data + sizeof(struct ethhdr);
	ic = (void *)(ip6 + 1);
	in = (void *)(ic + 1);
	if ((void *)in + quote > end)
		return XLB_DROP;
	ip6->vtc = 0x60;
	ip6->tc_flow = 0;
	ip6->flow_lbl = 0;
	ip6->payload_len = bpf_htons(sizeof(struct xlb_icmphdr) + quote);
	ip6->nexthdr = XLB_NEXTHDR_ICMPV6;
	ip6->hop_limit = 64;
	__builtin_memcpy(ip6->saddr, in->daddr, 16);
	__builtin_memcpy(ip6->daddr, in->saddr, 16);
	ic->type = XLB_ICMPV6_DEST_UNREACH;
	ic->code = 4; /* port unreachable */
	ic->checksum = 0;
	ic->rest = 0;
	/* Pseudo header: both addresses, length, next header. */
	sum = bpf_csum_diff(NULL, 0, (void *)ip6->saddr, 32, 0);
	sum = bpf_csum_diff(NULL, 0, pseudo, sizeof(pseudo), sum);
	sum = bpf_csum_diff(NULL, 0, (void *)ic, sizeof(struct xlb_icmphdr) + quote, sum);
	ic->checksum = csum_fold(sum);
	return 0;
}

/**
 * lb_reject() - refuse a new flow to a service without backends, as
 * kube-proxy and the nft data plane do: turn the packet into an ICMP
 * destination unreachable / port unreachable (ICMPv6 type 1 code 4) from
 * the VIP to the client and send it back out of the interface it came in
 * on. A TCP client's connect() fails at once with ECONNREFUSED, a UDP
 * client's next receive too, instead of waiting for retransmissions.
 *
 * The message quotes the IP header and the first 8 bytes of a UDP header,
 * or the 20 bytes of a TCP header without options: a locally sent TCP
 * segment (over a veth) is CHECKSUM_PARTIAL, and the kernel does not trim
 * such a packet before the end of its checksum field. It then stays
 * CHECKSUM_PARTIAL, which its receiver (the sender's stack) trusts. The
 * message is no larger than the packet it answers. IPv4 packets with
 * options are dropped instead.
 * Return: a tcx verdict (the redirect, or XLB_DROP if the packet cannot be
 * rewritten).
 */
static __attribute__((noinline)) int lb_reject(struct __sk_buff *skb, struct pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	__u32 ifindex = skb->ingress_ifindex ?: skb->ifindex;
	struct iphdr *ip = data + sizeof(struct ethhdr);
	__u8 smac[6], dmac[6];
	int rc;

	if ((void *)(ip + 1) > end)
		return XLB_DROP;
	__builtin_memcpy(dmac, data + 6, 6); /* back to the sender */
	__builtin_memcpy(smac, data, 6);
	if (p->k.family == XLB_AF_INET) {
		if (ip->ihl != 5)
			return XLB_DROP;
		if (p->k.proto == IPPROTO_TCP)
			rc = lb4_reject(skb, sizeof(struct iphdr) + sizeof(struct tcphdr));
		else
			rc = lb4_reject(skb, sizeof(struct iphdr) + sizeof(struct udphdr));
	} else {
		if (p->k.proto == IPPROTO_TCP)
			rc = lb6_reject(skb, sizeof(struct xlb_ipv6hdr) + sizeof(struct tcphdr));
		else
			rc = lb6_reject(skb, sizeof(struct xlb_ipv6hdr) + sizeof(struct udphdr));
	}
	if (rc)
		return rc;
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	if (data + sizeof(struct ethhdr) > end)
		return XLB_DROP;
	__builtin_memcpy(data, dmac, 6);
	__builtin_memcpy(data + 6, smac, 6);
	return bpf_redirect(ifindex, 0);
}

/**
 * lb_flow_mode() - the mode a new flow of service @svc to backend @be is
 * handled in: the service's, except that a dnat flow whose client is the
 * backend itself (hairpin: a pod reaching its own service) is masqueraded
 * as in snat mode, from the backend entry's snat address (the loader's
 * address towards it), so the backend's reply comes back through here
 * instead of going straight to itself. Without such an address (no
 * route at load time) the flow stays dnat.
 * Return: an enum xlb_mode value.
 */
static __always_inline __u8 lb_flow_mode(const struct svc_val *svc, const struct pkt *p,
					 const struct backend *be)
{
	if (svc->mode != XLB_MODE_DNAT || !addr_eq(p->k.src, be->addr))
		return svc->mode;
	if (!(be->snat[0] | be->snat[1] | be->snat[2] | be->snat[3]))
		return svc->mode;
	return XLB_MODE_SNAT;
}

/**
 * lb_dsr_midstream() - whether @p, a TCP segment without a conntrack entry
 * that is not a SYN, is taken up mid-stream: a plain ACK (with or without
 * data, PSH, FIN) to a dsr service. Such a flow was opened through another
 * node that the routers no longer send it to (ECMP after a node came,
 * went or was added); with the same backends, Maglev picks here the
 * backend that node picked, and dsr keeps no translation to miss, so the
 * flow goes on where it was (docs/ha.md), as the nft plane's conntrack
 * does with nf_conntrack_tcp_loose. Other modes need the first node's
 * translation, which only connection sync carries: refused as before.
 */
static __always_inline int lb_dsr_midstream(const struct pkt *p, const struct svc_val *svc)
{
	return svc->mode == XLB_MODE_DSR && p->k.proto == IPPROTO_TCP &&
	       (p->tcp_flags & (XLB_TCP_SYN | XLB_TCP_ACK | XLB_TCP_RST)) == XLB_TCP_ACK;
}

/**
 * lb4_new_flow() - a packet without conntrack entry: check it against its
 * farm's policies, and balance it if it is for a service, creating both
 * conntrack entries. The service is looked up first: its value carries the
 * farm's policies (tbl_svc_refs), so the check needs no lookup of its own;
 * not where farms are chosen by source table, whose choice counts the
 * source table's match, which a packet the policies drop must not.
 *
 * Return: a tcx verdict. Not a service: XLB_NEXT. TCP without SYN (or with
 * SYN+ACK): XLB_NEXT (the stack answers with a reset), but for dsr's
 * mid-stream ACKs (lb_dsr_midstream()). Service without
 * backends: refused (lb_reject()). No free snat port: XLB_DROP.
 */
static __always_inline int lb4_new_flow(struct __sk_buff *skb, struct pkt *p)
{
	struct svc_key key = {};
	struct svc_val *svc = NULL;
	struct backend *be;
	struct ct_val fv = {}, *v;
	struct scratch *sc;
	__u32 zero = 0;
	__u32 bid, i;
	__u16 port;
	__u64 now;
	int fresh, midstream;

	if (!(tbl_conf() & XLB_TBL_CONF_STEER))
		svc = svc_find(p, &key);
	if (tbl_check_new(skb, p, svc)) {
		stat_inc(XLB_STAT_POLICY_DROP);
		return XLB_DROP;
	}
	if (!svc && !key.proto) /* not looked up yet (farms chosen by source table) */
		svc = svc_find(p, &key);
	if (!svc)
		return lb4_stateless_reply(skb, p);
	if (svc->mode == XLB_MODE_STLSDNAT)
		return lb4_stateless(skb, p, svc, &key);
	/* Mode local: the farm's policies were checked (tbl_denied); the
	 * node's own socket on the address answers. */
	if (svc->mode == XLB_MODE_LOCAL) {
		sc = bpf_map_lookup_elem(&xlb_scratch, &zero);
		if (sc && tbl_flow_mark(sc))
			skb->mark = sc->mark; /* its mark table's, for the node's rules */
		return XLB_NEXT;
	}
	midstream = lb_dsr_midstream(p, svc);
	if (p->k.proto == IPPROTO_TCP && !midstream &&
	    (p->tcp_flags & (XLB_TCP_SYN | XLB_TCP_ACK | XLB_TCP_RST)) != XLB_TCP_SYN) {
		stat_inc(XLB_STAT_NOT_SYN);
		return XLB_NEXT;
	}
	if (client_new_limited(p, svc)) {
		stat_inc(XLB_STAT_RATE_DROP);
		return XLB_DROP;
	}
	if (svc->slots == 0) {
		stat_inc(XLB_STAT_NO_BACKEND);
		return lb_reject(skb, p);
	}
	sc = bpf_map_lookup_elem(&xlb_scratch, &zero);
	if (!sc)
		return XLB_DROP;
	now = xlb_now();
	bid = lb4_pick(p, svc, &key, now);
	be = bid ? bpf_map_lookup_elem(&xlb_backends, &bid) : NULL;
	if (!be) {
		stat_inc(XLB_STAT_NO_BACKEND);
		return XLB_DROP;
	}

	__builtin_memcpy(fv.src, p->k.src, 16);
	__builtin_memcpy(fv.dst, be->addr, 16);
	fv.sport = p->k.sport;
	fv.dport = be->port ?: p->k.dport;
	fv.dir = XLB_CT_FWD;
	if (p->k.proto != IPPROTO_TCP)
		fv.state = XLB_CT_STATE_UDP;
	else if (midstream) /* established, or closing if it carries a FIN */
		fv.state = ct_next_state(XLB_CT_STATE_EST, p->tcp_flags);
	else
		fv.state = XLB_CT_STATE_SYN;
	fv.mode = lb_flow_mode(svc, p, be);
	fv.svc = svc->id;
	fv.backend = bid;
	fv.seen = now;
	/* The backend's mark over the table's, as the nft plane's NAT chain
	 * (priority -100) sets it after the table chains (-110). */
	fv.mark = be->mark ?: tbl_flow_mark(sc);
	fv.dscp = tbl_flow_dscp(sc);

	if (fv.mode == XLB_MODE_DSR) {
		/* The packet keeps its tuple; only the next hop changes. */
		__builtin_memcpy(fv.dst, p->k.dst, 16);
		fv.dport = p->k.dport;
	} else if (fv.mode == XLB_MODE_SNAT) {
		/* The reply entry's key is the allocation: inserting it with
		 * BPF_NOEXIST claims (backend, port, snat address, port)
		 * atomically across CPUs. First try the client's own port. */
		__builtin_memcpy(fv.src, be->snat, 16);
		port = p->k.sport;
		if (bpf_ntohs(port) < xlb_snat_port_min || bpf_ntohs(port) > xlb_snat_port_max)
			port = snat_port();
		for (i = 0; i < XLB_SNAT_TRIES; i++) {
			fv.sport = port;
			ct_peer(&p->k, &fv, &sc->rk, &sc->rv);
			if (bpf_map_update_elem(&xlb_ct, &sc->rk, &sc->rv, BPF_NOEXIST) == 0)
				break;
			port = snat_port();
		}
		if (i == XLB_SNAT_TRIES) {
			stat_inc(XLB_STAT_SNAT_FULL);
			return XLB_DROP;
		}
	} else {
		ct_peer(&p->k, &fv, &sc->rk, &sc->rv);
		if (bpf_map_update_elem(&xlb_ct, &sc->rk, &sc->rv, BPF_ANY)) {
			stat_inc(XLB_STAT_ERROR);
			return XLB_DROP;
		}
	}

	fresh = 1;
	if (bpf_map_update_elem(&xlb_ct, &p->k, &fv, BPF_NOEXIST)) {
		/* Another CPU created this flow first: drop our reply entry
		 * (unless it is the same as the winner's) and use the winner. */
		stat_inc(XLB_STAT_CT_RACE);
		v = bpf_map_lookup_elem(&xlb_ct, &p->k);
		if (!v) {
			if (svc->mode != XLB_MODE_DSR)
				bpf_map_delete_elem(&xlb_ct, &sc->rk);
			stat_inc(XLB_STAT_ERROR);
			return XLB_DROP;
		}
		if (svc->mode != XLB_MODE_DSR &&
		    (!addr_eq(v->dst, fv.dst) || !addr_eq(v->src, fv.src) || v->sport != fv.sport ||
		     v->dport != fv.dport))
			bpf_map_delete_elem(&xlb_ct, &sc->rk);
		fresh = 0;
		be_count(v->backend, XLB_CT_FWD, skb->len, 0);
	} else {
		stat_inc(XLB_STAT_NEW_FLOW);
		be_count(bid, XLB_CT_FWD, skb->len, 1);
		lb_log(p, &fv, be);
		sync_emit(XLB_SYNC_NEW, &p->k, &fv);
		/* TCP in SYN or EST (a dsr flow taken up mid-stream); taken
		 * back by lc_set_state(). */
		if (lc_counted(fv.state))
			lc_add(bid, 1);
		if (p->k.proto == IPPROTO_TCP && !midstream)
			passive_new_flow(&p->k, fv.svc, bid, now);
		v = bpf_map_lookup_elem(&xlb_ct, &p->k);
		if (!v) {
			/* Evicted at once (table far too small): forward uncached. */
			v = &fv;
		}
	}
	return lb4_nat_call(skb, p, v, fresh);
}

/**
 * lb4_ct_hit() - a packet of a tracked flow: track its TCP state, then
 * translate it.
 *
 * A forward packet whose backend is down or off in its farm (flagged
 * XLB_BE_F_GONE in xlb_be_flags) expires the flow, as IPVS does with
 * expire_nodest_conn: a UDP datagram or a TCP SYN is scheduled afresh, any
 * other TCP segment is dropped (the client's next connection goes to a
 * serving backend). Drained backends (weight 0), those of a higher priority
 * level, and backends removed from the farm keep their flows.
 *
 * Return: a tcx verdict, or XLB_CT_MISS after removing the flow when it has
 * expired, its backend is down, or a SYN opens a new connection on its
 * tuple (the client reused its port after FIN/RST, or the backend no longer
 * exists).
 */
static __always_inline int lb4_ct_hit(struct __sk_buff *skb, struct pkt *p, struct ct_val *v)
{
	__u64 now = xlb_now();
	int fresh = 0;

	if (xlb_elapsed(now, v->seen) > xlb_ct_refresh_ns) {
		__u64 last = v->seen;

		if (ct_expired(&p->k, v, now)) {
			stat_inc(XLB_STAT_CT_EXPIRED);
			ct_delete(&p->k, v);
			return XLB_CT_MISS;
		}
		ct_refresh(&p->k, v, now);
		if (sync_due(last, now))
			sync_emit(XLB_SYNC_UPDATE, &p->k, v);
		fresh = 1;
	}
	if (v->dir == XLB_CT_FWD) {
		__u32 bid = v->backend;
		__u32 *fl = bpf_map_lookup_elem(&xlb_be_flags, &bid);

		if (fl && (*fl & XLB_BE_F_GONE)) {
			stat_inc(XLB_STAT_CT_NODEST);
			ct_delete(&p->k, v);
			if (p->k.proto == IPPROTO_TCP &&
			    (p->tcp_flags & (XLB_TCP_SYN | XLB_TCP_ACK | XLB_TCP_RST)) !=
				    XLB_TCP_SYN)
				return XLB_DROP;
			return XLB_CT_MISS;
		}
	}
	if (p->k.proto == IPPROTO_TCP) {
		__u8 st;

		if (v->dir == XLB_CT_FWD &&
		    (p->tcp_flags & (XLB_TCP_SYN | XLB_TCP_ACK)) == XLB_TCP_SYN) {
			/* A SYN on a tracked tuple: a retransmission keeps its
			 * backend; a new connection on a closed tuple, or one
			 * whose backend is gone (removed from its farm), is
			 * scheduled afresh. */
			__u32 bid = v->backend;

			if (v->state == XLB_CT_STATE_FIN || v->state == XLB_CT_STATE_CLOSE ||
			    !bpf_map_lookup_elem(&xlb_backends, &bid)) {
				ct_delete(&p->k, v);
				return XLB_CT_MISS;
			}
		}
		if (v->dir == XLB_CT_REPLY && v->state == XLB_CT_STATE_SYN)
			passive_reply(&p->k, v, p->tcp_flags, now);
		st = ct_next_state(v->state, p->tcp_flags);
		if (st != v->state) {
			ct_set_state(&p->k, v, st, now);
			sync_emit(XLB_SYNC_UPDATE, &p->k, v);
		}
	}
	stat_inc(v->dir == XLB_CT_FWD ? XLB_STAT_CT_FWD : XLB_STAT_CT_REPLY);
	be_count(v->backend, v->dir, skb->len, 0);
	return lb4_nat(skb, p, v, fresh);
}

/**
 * lb4_icmp() - translate an ICMP error (destination unreachable, e.g.
 * fragmentation needed or port unreachable; time exceeded) about a packet
 * of a tracked flow, so its sender recognises it: the quoted packet gets the
 * tuple its sender used (e.g. client -> VIP instead of client -> backend),
 * the message goes to that sender (the client instead of the snat address).
 * The ICMP checksum and both IPv4 checksums are updated; the quoted TCP/UDP
 * checksum is not (ICMP quotes are not checked by receivers, and a TCP
 * checksum is often not quoted at all).
 *
 * Return: a tcx verdict; XLB_NEXT for anything else (other ICMP types,
 * quotes of untracked flows, quotes with IPv4 options, truncated quotes).
 */
static __always_inline int lb4_icmp(struct __sk_buff *skb, struct pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	__u32 l4off = p->l4off & 0x7f;
	struct iphdr *ip = data + sizeof(struct ethhdr);
	struct xlb_icmphdr *ic = data + l4off;
	struct bpf_fib_lookup fib = {};
	struct iphdr *in;
	struct ct_key k = {};
	struct ct_val *v;
	__u32 osrc, odst, isrc, idst;
	__u16 *ports, isport, idport, icheck, nw;
	int rc;

	if ((void *)(ip + 1) > end || (void *)(ic + 1) > end)
		return XLB_NEXT;
	if (ic->type != XLB_ICMP_DEST_UNREACH && ic->type != XLB_ICMP_TIME_EXCEEDED)
		return XLB_NEXT;
	in = (void *)(ic + 1);
	if ((void *)(in + 1) > end)
		return XLB_NEXT;
	ports = (void *)(in + 1);
	if ((void *)(ports + 2) > end || in->version != 4 || in->ihl != 5 ||
	    (in->protocol != IPPROTO_TCP && in->protocol != IPPROTO_UDP))
		return XLB_NEXT;

	/* The quoted packet went from its sender to the ICMP's source side;
	 * its reverse is a packet coming back, whose entry we look up. */
	k.src[0] = in->daddr;
	k.dst[0] = in->saddr;
	k.sport = ports[1];
	k.dport = ports[0];
	k.proto = in->protocol;
	k.family = XLB_AF_INET;
	v = bpf_map_lookup_elem(&xlb_ct, &k);
	if (!v)
		return XLB_NEXT;
	if (ic->type == XLB_ICMP_DEST_UNREACH && ic->code != XLB_ICMP_FRAG_NEEDED)
		passive_icmp(&k, v);
	if (p->ttl <= 1)
		return XLB_NEXT;

	/* Where the message goes: the sender as it knows itself. */
	odst = v->dst[0];
	osrc = ip->saddr == in->daddr ? v->src[0] : ip->saddr;
	fib.family = AF_INET;
	fib.l4_protocol = IPPROTO_ICMP;
	fib.ifindex = skb->ingress_ifindex ?: skb->ifindex;
	fib.ipv4_src = osrc;
	fib.ipv4_dst = odst;
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS)
		return XLB_NEXT;

	/* Re-derive after the helper (packet pointers are invalid). */
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	ip = data + sizeof(struct ethhdr);
	ic = data + l4off;
	in = (void *)(ic + 1);
	ports = (void *)(in + 1);
	if ((void *)(ip + 1) > end || (void *)(ic + 1) > end || (void *)(in + 1) > end ||
	    (void *)(ports + 2) > end)
		return XLB_NEXT;

	/* The quoted packet. */
	isrc = in->saddr;
	idst = in->daddr;
	isport = ports[0];
	idport = ports[1];
	icheck = in->check;
	in->saddr = v->dst[0];
	in->daddr = v->src[0];
	ports[0] = v->dport;
	ports[1] = v->sport;
	csum32_replace(&in->check, isrc, in->saddr);
	csum32_replace(&in->check, idst, in->daddr);
	csum32_replace(&ic->checksum, isrc, in->saddr);
	csum32_replace(&ic->checksum, idst, in->daddr);
	csum16_replace(&ic->checksum, isport, ports[0]);
	csum16_replace(&ic->checksum, idport, ports[1]);
	csum16_replace(&ic->checksum, icheck, in->check);

	/* The message itself: addresses, TTL, MACs. */
	nw = p->ttl_word;
	((__u8 *)&nw)[0] = p->ttl - 1;
	ip->ttl = p->ttl - 1;
	csum16_replace(&ip->check, p->ttl_word, nw);
	csum32_replace(&ip->check, ip->saddr, osrc);
	csum32_replace(&ip->check, ip->daddr, odst);
	ip->saddr = osrc;
	ip->daddr = odst;
	if (data + 12 > end)
		return XLB_DROP;
	__builtin_memcpy(data, fib.dmac, 6);
	__builtin_memcpy(data + 6, fib.smac, 6);
	stat_inc(XLB_STAT_ICMP_NAT);
	return bpf_redirect(fib.ifindex, 0);
}

/**
 * lb6_icmp() - lb4_icmp() for ICMPv6 errors (destination unreachable,
 * packet too big, time exceeded). The ICMPv6 checksum covers the IPv6
 * pseudo header too, so the new outer addresses go into it as well.
 * Neighbour discovery and every other ICMPv6 message: XLB_NEXT.
 */
static __always_inline int lb6_icmp(struct __sk_buff *skb, struct pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct xlb_ipv6hdr *ip6 = data + sizeof(struct ethhdr);
	struct xlb_icmphdr *ic = (void *)(ip6 + 1);
	struct xlb_ipv6hdr *in = (void *)(ic + 1);
	__u16 *ports = (void *)(in + 1);
	struct bpf_fib_lookup fib = {};
	struct ct_key k = {};
	struct ct_val *v;
	__u32 osrc[4], odst[4], old[4];
	__u16 isport, idport;
	int rc, i;

	if ((void *)(ports + 2) > end)
		return XLB_NEXT;
	if (ic->type != XLB_ICMPV6_DEST_UNREACH && ic->type != XLB_ICMPV6_PKT_TOOBIG &&
	    ic->type != XLB_ICMPV6_TIME_EXCEED)
		return XLB_NEXT;
	if ((in->vtc >> 4) != 6 || (in->nexthdr != IPPROTO_TCP && in->nexthdr != IPPROTO_UDP))
		return XLB_NEXT;

	__builtin_memcpy(k.src, in->daddr, 16);
	__builtin_memcpy(k.dst, in->saddr, 16);
	k.sport = ports[1];
	k.dport = ports[0];
	k.proto = in->nexthdr;
	k.family = XLB_AF_INET6;
	v = bpf_map_lookup_elem(&xlb_ct, &k);
	if (!v)
		return XLB_NEXT;
	if (ic->type == XLB_ICMPV6_DEST_UNREACH)
		passive_icmp(&k, v);
	if (p->ttl <= 1)
		return XLB_NEXT;

	__builtin_memcpy(odst, v->dst, 16);
	if (addr_eq(ip6->saddr, in->daddr))
		__builtin_memcpy(osrc, v->src, 16);
	else
		__builtin_memcpy(osrc, ip6->saddr, 16);
	fib.family = AF_INET6;
	fib.l4_protocol = XLB_NEXTHDR_ICMPV6;
	fib.ifindex = skb->ingress_ifindex ?: skb->ifindex;
	__builtin_memcpy(fib.ipv6_src, osrc, 16);
	__builtin_memcpy(fib.ipv6_dst, odst, 16);
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS)
		return XLB_NEXT;

	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	ip6 = data + sizeof(struct ethhdr);
	ic = (void *)(ip6 + 1);
	in = (void *)(ic + 1);
	ports = (void *)(in + 1);
	if ((void *)(ports + 2) > end)
		return XLB_NEXT;

	/* The quoted packet (no IPv6 header checksum). */
	isport = ports[0];
	idport = ports[1];
	for (i = 0; i < 4; i++) {
		old[i] = in->saddr[i];
		in->saddr[i] = v->dst[i];
		csum32_replace(&ic->checksum, old[i], in->saddr[i]);
		old[i] = in->daddr[i];
		in->daddr[i] = v->src[i];
		csum32_replace(&ic->checksum, old[i], in->daddr[i]);
	}
	ports[0] = v->dport;
	ports[1] = v->sport;
	csum16_replace(&ic->checksum, isport, ports[0]);
	csum16_replace(&ic->checksum, idport, ports[1]);

	/* The message: addresses (in the pseudo header), hop limit, MACs. */
	for (i = 0; i < 4; i++) {
		csum32_replace(&ic->checksum, ip6->saddr[i], osrc[i]);
		csum32_replace(&ic->checksum, ip6->daddr[i], odst[i]);
		ip6->saddr[i] = osrc[i];
		ip6->daddr[i] = odst[i];
	}
	ip6->hop_limit = p->ttl - 1;
	if (data + 12 > end)
		return XLB_DROP;
	__builtin_memcpy(data, fib.dmac, 6);
	__builtin_memcpy(data + 6, fib.smac, 6);
	stat_inc(XLB_STAT_ICMP_NAT);
	return bpf_redirect(fib.ifindex, 0);
}

/* xlb_clock_sample: [0] jiffies, [1] bpf_ktime_get_coarse_ns(), [2] jiffies
 * again, as one run of xlb_clock saw them (Plane.calibrateClock); [3]
 * xlb_now() (tests compare it with [1]). */
__u64 xlb_clock_sample[4];

/* xlb_clock() - sample jiffies and the coarse clock together, for the
 * loader's calibration of xlb_now(). Never attached; run with
 * BPF_PROG_TEST_RUN. */
SEC("tc")
int xlb_clock(struct __sk_buff *skb)
{
	xlb_clock_sample[0] = bpf_jiffies64();
	xlb_clock_sample[1] = bpf_ktime_get_coarse_ns();
	xlb_clock_sample[2] = bpf_jiffies64();
	xlb_clock_sample[3] = xlb_now();
	return XLB_NEXT;
}

/**
 * xlb_ct_remove() - remove the flow whose entry's key is @ctx (a struct
 * ct_key, either direction) as the program removes its own (ct_delete):
 * its forward entry is counted out of its backend's active connections
 * (xlb_lc.h), exactly once however it races with packets. Never attached;
 * the loader runs it with BPF_PROG_TEST_RUN for each flow it deletes
 * (xlb connections delete), since user space cannot do the atomic exchange.
 * Return: 0 when removed, 1 when there was no such entry.
 */
SEC("syscall")
int xlb_ct_remove(struct ct_key *ctx)
{
	struct ct_key k;
	struct ct_val *v;

	__builtin_memcpy(&k, ctx, sizeof(k));
	v = bpf_map_lookup_elem(&xlb_ct, &k);
	if (!v)
		return 1;
	sync_emit(XLB_SYNC_END, &k, v);
	ct_delete(&k, v);
	return 0;
}

/* skb->pkt_type of a frame whose destination MAC is not the interface's
 * (linux/if_packet.h). */
#define XLB_PACKET_OTHERHOST 3
/* The loopback's ifindex in every network namespace (LOOPBACK_IFINDEX). */
#define XLB_LOOPBACK_IFINDEX 1

/**
 * lb_host_mac() - whether @mac is the address of one of this namespace's
 * interfaces (xlb_host_mac).
 */
static __always_inline int lb_host_mac(const __u8 *mac)
{
	struct host_mac_key k = {};

	__builtin_memcpy(k.mac, mac, 6);
	return bpf_map_lookup_elem(&xlb_host_mac, &k) != NULL;
}

/**
 * lb_other_host() - whether @skb is a frame for another host: the kernel
 * marked it PACKET_OTHERHOST on the interface it came in on, and its
 * destination is no other interface of this namespace either (a bridge
 * port sees the frames for its bridge's MAC so, a lower device its
 * macvlans'). The stack drops such a frame, or bridges it on; balancing it
 * would answer for another host (a second node on a flooding segment
 * would serve the flow too). Costs frames of this host one field read.
 */
static __always_inline int lb_other_host(struct __sk_buff *skb)
{
	__u8 mac[6];

	/* The loopback carries only this host's frames. BPF_PROG_TEST_RUN
	 * builds its skb there, where the zero MAC makes any frame another
	 * host's to the kernel. */
	if (skb->pkt_type != XLB_PACKET_OTHERHOST || skb->ifindex == XLB_LOOPBACK_IFINDEX)
		return 0;
	if (bpf_skb_load_bytes(skb, 0, mac, sizeof(mac)))
		return 1;
	return !lb_host_mac(mac);
}

/**
 * xdp_other_host() - lb_other_host() for the XDP program, which has no
 * pkt_type: whether the frame at @data (12 bytes readable) that came in on
 * @ifindex is unicast to a MAC that is none of this namespace's: not its
 * interface's (xlb_if_mac, the common case: an array lookup) nor another
 * interface's (xlb_host_mac). Asked only before the program acts (a drop,
 * a forward): such a frame goes on to the stack and the tcx program,
 * which leave it alone.
 */
static __always_inline int xdp_other_host(__u32 ifindex, const __u8 *data)
{
	struct if_mac *m;

	if (data[0] & 1)
		return 0; /* multicast, broadcast */
	m = bpf_map_lookup_elem(&xlb_if_mac, &ifindex);
	if (m && m->set && *(__u32 *)m->mac == *(__u32 *)data &&
	    *(__u16 *)(m->mac + 4) == *(__u16 *)(data + 4))
		return 0;
	return !lb_host_mac(data);
}

/**
 * xlb_xdp() - the XDP fast path: a packet a farm's policy refuses is
 * dropped here, before the kernel builds an skb for it; a forward packet of a tracked dsr flow
 * whose next hop is cached leaves at once (MACs and TTL rewritten,
 * XDP_REDIRECT), before the kernel builds an skb for it in native mode.
 * Everything else — new flows, replies, other modes, TCP state changes
 * (SYN, FIN, RST, the handshake's ACK), entries due for their periodic
 * refresh, backends gone, TTL 1, next hops XDP cannot transmit to —
 * goes on (XDP_PASS) to the tcx program, which does the full work.
 */
SEC("xdp")
int xlb_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct tbl_in in = { .ifindex = ctx->ingress_ifindex, .xdp = 1 };
	struct pkt p = {};
	struct ct_val *v;
	__u32 bid, ifindex, *fl;

	if (lb_parse_data(data, end, &p) != XLB_PARSE_OK)
		return XDP_PASS;
	if (data + 12 > end)
		return XDP_PASS;
	v = bpf_map_lookup_elem(&xlb_ct, &p.k);
	__builtin_memcpy(in.smac, data + 6, 6);
	if (tbl_check(&p, &in, v, end - data > ETH_HLEN ? end - data - ETH_HLEN : 0, 1)) {
		if (xdp_other_host(ctx->ingress_ifindex, data))
			return XDP_PASS;
		stat_inc(XLB_STAT_XDP_POLICY_DROP);
		return XDP_DROP;
	}
	/* A marked flow's packets need skb->mark, which XDP has not. */
	if (!v || v->mode != XLB_MODE_DSR || v->dir != XLB_CT_FWD || !v->ifindex || p.ttl <= 1 ||
	    v->mark)
		return XDP_PASS;
	if (xlb_elapsed(xlb_now(), v->seen) > xlb_ct_refresh_ns)
		return XDP_PASS; /* tcx refreshes the entry, or expires it */
	if (p.k.proto == IPPROTO_TCP &&
	    ((p.tcp_flags & (XLB_TCP_SYN | XLB_TCP_RST | XLB_TCP_FIN)) ||
	     ct_next_state(v->state, p.tcp_flags) != v->state))
		return XDP_PASS;
	bid = v->backend;
	fl = bpf_map_lookup_elem(&xlb_be_flags, &bid);
	if (fl && (*fl & XLB_BE_F_GONE))
		return XDP_PASS;
	ifindex = v->ifindex;
	if (!xlb_xdp_any_tx && !bpf_map_lookup_elem(&xlb_xdp_tx, &ifindex))
		return XDP_PASS;
	if (xdp_other_host(ctx->ingress_ifindex, data))
		return XDP_PASS;

	if (data + sizeof(struct ethhdr) > end)
		return XDP_PASS;
	if (p.k.family == XLB_AF_INET) {
		struct iphdr *ip = data + sizeof(struct ethhdr);
		__u16 nw = p.ttl_word;

		if ((void *)(ip + 1) > end)
			return XDP_PASS;
		((__u8 *)&nw)[0] = p.ttl - 1;
		ip->ttl = p.ttl - 1;
		csum16_replace(&ip->check, p.ttl_word, nw);
		if (v->dscp)
			ip4_set_dscp(ip, v->dscp);
	} else {
		struct xlb_ipv6hdr *ip6 = data + sizeof(struct ethhdr);

		if ((void *)(ip6 + 1) > end)
			return XDP_PASS;
		ip6->hop_limit = p.ttl - 1;
		if (v->dscp)
			ip6_set_dscp(ip6, v->dscp);
	}
	__builtin_memcpy(data, v->dmac, 6);
	__builtin_memcpy(data + 6, v->smac, 6);
	be_count(bid, XLB_CT_FWD, end - data, 0);
	stat_inc(XLB_STAT_XDP_FWD);
	return bpf_redirect(ifindex, 0);
}

SEC("tcx/ingress")
int xlb_ingress(struct __sk_buff *skb)
{
	struct pkt p = {};
	struct ct_val *v;
	int rc;

	stat_inc(XLB_STAT_RX);
	if (lb_other_host(skb)) {
		stat_inc(XLB_STAT_OTHER_HOST);
		return XLB_NEXT;
	}
	switch (lb_parse(skb, &p)) {
	case XLB_PARSE_OK:
		break;
	case XLB_PARSE_FRAGMENT:
		stat_inc(XLB_STAT_FRAGMENT);
		return XLB_NEXT;
	case XLB_PARSE_ICMP:
		if (p.k.family == XLB_AF_INET6)
			return lb6_icmp(skb, &p);
		return lb4_icmp(skb, &p);
	default:
		stat_inc(XLB_STAT_NOT_PARSED);
		return XLB_NEXT;
	}
	/* The policy check (xlb_tables.h) comes first; a tracked flow that
	 * passed it under the current policy generation pays one compare. A
	 * packet without entry is checked by lb4_new_flow, as is a flow whose
	 * entry turns out to be gone: checked in full, its limit applied. */
	v = bpf_map_lookup_elem(&xlb_ct, &p.k);
	if (v && tbl_check_skb(skb, &p, v)) {
		stat_inc(XLB_STAT_POLICY_DROP);
		return XLB_DROP;
	}
	/* rst-rtlimit per client (xlb_climit.h): the XDP program passes
	 * resets here. */
	if ((p.tcp_flags & XLB_TCP_RST) && client_rst_limited(&p)) {
		stat_inc(XLB_STAT_RATE_DROP);
		return XLB_DROP;
	}
	if (v) {
		rc = lb4_ct_hit(skb, &p, v);
		if (rc != XLB_CT_MISS)
			return rc;
	}
	return lb4_new_flow(skb, &p);
}
