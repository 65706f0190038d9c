//go:build ignore

/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* xlb's socket programs: socket-level balancing of what the node itself
 * sends (host processes, hostNetwork Pods, the kubelet), as Cilium's
 * socket-LB does (bpf/bpf_sock.c there).
 *
 * The tc program (xlb_lb.c) sees packets arriving on an interface; a
 * connection the node opens itself never arrives on one. These programs,
 * attached to a cgroup v2, translate the address a socket asks for instead:
 * connect() and sendmsg() to a service address (a ClusterIP, a node address
 * with a NodePort, ...) go to a backend chosen from the same maps, with the
 * same schedulers and persistence (xlb_pick.h), and the socket talks to the
 * backend directly: no NAT and no conntrack entry per packet, the choice is
 * made once per connection. getpeername() and recvmsg() translate the
 * backend's address back, so the application sees the address it asked
 * for.
 *
 * At connect time there is no source port yet (the kernel picks it later)
 * and no source address: the node is one client, keyed by the zero address
 * for persistence and hash schedulers, and the source port is random (each
 * connection a new port, as it would have been).
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "xlb_consts.h"
#include "xlb_structs.h"
#include "xlb_maps.h"
#include "xlb_parsing.h"
#include "xlb_csum.h"
#include "xlb_pick.h"
#define XLB_TABLES_SOCK /* xlb_tables.h: no packet-program parts */
#include "xlb_tables.h"

/* A sock_addr program returns 1 to let the call proceed, 0 to fail it (with
 * the error set by bpf_set_retval, EPERM without). */
#define XLB_SYS_REJECT 0
#define XLB_SYS_PROCEED 1
#define XLB_ECONNREFUSED 111
#define XLB_EPERM 1

char __license[] SEC("license") = "Dual BSD/GPL";

/* The network namespace whose sockets are balanced: its cookie
 * (SO_NETNS_COOKIE), set by the loader to the plane's namespace. The maps
 * hold that namespace's services; a process of the cgroup in another
 * namespace (a Pod that is not hostNetwork) keeps the tc path. */
volatile const __u64 xlb_sock_netns = 0;

/* Set by the loader (Options.PoliciesOnOutput): check the farms' policies
 * (named tables) for the connections balanced here, as kube-proxy filters
 * the node's own connections by loadBalancerSourceRanges. */
volatile const __u8 xlb_sock_policies = 0;

/* xlb_sock_rev key: a socket and the backend it was sent to. */
struct sock_rev_key {
	__u64 cookie;  /* host: socket cookie */
	__u32 addr[4]; /* net: backend address */
	__u16 port;    /* net: backend port */
	__u8 family;   /* XLB_AF_* */
	__u8 pad;
	__u32 pad2;
};

/* xlb_sock_rev value: the address the socket asked for. */
struct sock_rev_val {
	__u32 addr[4]; /* net: service address */
	__u16 port;    /* net: service port */
	__u16 pad;
};

/* xlb_sock_fwd key: an unconnected UDP socket and a service address it
 * sends to. */
struct sock_fwd_key {
	__u64 cookie;  /* host: socket cookie */
	__u32 addr[4]; /* net: service address */
	__u16 port;    /* net: service port */
	__u8 family;   /* XLB_AF_* */
	__u8 pad;
	__u32 pad2;
};

/* xlb_sock_fwd value: the backend its datagrams go to. */
struct sock_fwd_val {
	__u32 addr[4]; /* net */
	__u16 port;    /* net */
	__u16 pad;
};

/* Counters of the socket programs (per CPU, by index). */
enum xlb_sock_stat {
	XLB_SOCK_STAT_XLATE = 0,   /* connect/sendmsg to a service: sent to a backend */
	XLB_SOCK_STAT_REFUSED,	   /* service without backends: ECONNREFUSED */
	XLB_SOCK_STAT_STICKY,	   /* sendmsg: the socket's backend of an earlier datagram */
	XLB_SOCK_STAT_REV,	   /* getpeername/recvmsg: backend shown as the service */
	XLB_SOCK_STAT_OTHER_NETNS, /* a socket of another network namespace: left alone */
	XLB_SOCK_STAT_DENIED,	   /* the farm's policies refuse the source: EPERM */
	XLB_SOCK_STAT_MAX,
};

#ifndef XLB_SOCK_REV_SIZE
#define XLB_SOCK_REV_SIZE 262144
#endif

/* (socket, backend) -> service address: what getpeername() and recvmsg()
 * show. LRU: entries of closed sockets age out (as Cilium's
 * cilium_lb4_reverse_sk). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock_rev_key);
	__type(value, struct sock_rev_val);
	__uint(max_entries, XLB_SOCK_REV_SIZE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_sock_rev SEC(".maps");

/* (unconnected UDP socket, service address) -> backend: the datagrams of
 * one socket to one service go to one backend while it stays in the
 * service, as conntrack keeps a UDP flow on one (a per-datagram choice
 * would spread a client's requests and replies over every backend). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sock_fwd_key);
	__type(value, struct sock_fwd_val);
	__uint(max_entries, XLB_SOCK_REV_SIZE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_sock_fwd SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, XLB_SOCK_STAT_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlb_sock_stats SEC(".maps");

/* Keeps the types and the enum in the BTF for bpf2go (-type). */
const struct sock_rev_key *xlb_unused_sock_rev_key __attribute__((unused));
const struct sock_rev_val *xlb_unused_sock_rev_val __attribute__((unused));
const struct sock_fwd_key *xlb_unused_sock_fwd_key __attribute__((unused));
const struct sock_fwd_val *xlb_unused_sock_fwd_val __attribute__((unused));
const enum xlb_sock_stat *xlb_unused_sock_stat __attribute__((unused));

static __always_inline void sock_stat(__u32 idx)
{
	__u64 *c = bpf_map_lookup_elem(&xlb_sock_stats, &idx);

	if (c)
		*c += 1;
}

/* A socket address as the programs handle it. */
struct sock_dst {
	__u32 addr[4]; /* net; IPv4 in [0] */
	__u32 src[4];  /* net: the socket's bound address, of addr's family; zero: not bound */
	__u16 port;    /* net */
	__u8 proto;
	__u8 family; /* XLB_AF_*: of the address, not of the socket */
	__u8 mapped; /* an IPv4 address of an IPv6 socket (::ffff:a.b.c.d) */
	__u8 pad[3];
};

/* sock_ours() - whether @ctx's socket belongs to the namespace served. */
static __always_inline int sock_ours(struct bpf_sock_addr *ctx)
{
	if (xlb_sock_netns && bpf_get_netns_cookie(ctx) != xlb_sock_netns) {
		sock_stat(XLB_SOCK_STAT_OTHER_NETNS);
		return 0;
	}
	return 1;
}

/**
 * sock_sticky() - the backend of an earlier datagram of this socket to
 * the service, if it is still an active backend of the service's current
 * generation.
 * Return: the backend id, 0 if none.
 */
static __always_inline __u32 sock_sticky(struct sock_fwd_key *fk, struct svc_val *svc)
{
	struct be_index_key ik = { .svc = svc->id };
	struct sock_fwd_val *fv;
	__u32 *bid;

	fv = bpf_map_lookup_elem(&xlb_sock_fwd, fk);
	if (!fv)
		return 0;
	__builtin_memcpy(ik.addr, fv->addr, 16);
	ik.port = fv->port;
	bid = bpf_map_lookup_elem(&xlb_be_index, &ik);
	if (!bid)
		return 0;
	sock_stat(XLB_SOCK_STAT_STICKY);
	return *bid;
}

/**
 * sock_denied() - whether the policies of the farm of @d (its service key
 * @key) refuse the socket: checked with the socket's bound address, or for
 * an unbound one with the node's address towards the VIP that the loader
 * wrote next to the policies (the kernel picks the source only after
 * connect(), by the route to the backend this program chooses).
 * Return: 1 to refuse, 0 otherwise.
 */
static __always_inline int sock_denied(const struct sock_dst *d)
{
	struct tbl_policy *pol;
	struct pkt p = {};
	struct tbl_in in = {}; /* a socket has no Ethernet source nor interface: mac and iface
				* tables match nothing (nft's output hook: meta iifname "") */
	__u32 conf = tbl_conf();

	if (!xlb_sock_policies)
		return 0;
	__builtin_memcpy(p.k.dst, d->addr, 16);
	p.k.dport = d->port;
	p.k.proto = d->proto;
	p.k.family = d->family;
	pol = tbl_policies(&p, conf);
	if (!pol)
		return 0;
	if (d->src[0] | d->src[1] | d->src[2] | d->src[3])
		__builtin_memcpy(p.k.src, d->src, 16);
	else
		__builtin_memcpy(p.k.src, pol->node_src, 16);
	return tbl_denied(&p, &in, 0, NULL, conf);
}

/**
 * sock_fwd() - translate @d, the destination a socket asks for, to a
 * backend when it is a service's address.
 * @d: the destination; rewritten to the backend's
 * @cookie: the socket's cookie
 * @sticky: 1 for sendmsg (keep the socket on the backend of its earlier
 *          datagrams), 0 for connect
 *
 * Return: XLB_SYS_PROCEED (translated or not a service), XLB_SYS_REJECT
 * with ECONNREFUSED for a service without backends (as the tc program
 * answers a new flow with ICMP port unreachable).
 */
static __attribute__((noinline)) int sock_fwd(struct sock_dst *d, __u64 cookie, int sticky)
{
	struct sock_rev_key rk = { .cookie = cookie, .family = d->family };
	struct sock_fwd_key fk = { .cookie = cookie, .family = d->family };
	struct sock_rev_val rv = {};
	struct svc_key key = {};
	struct pkt p = {};
	struct svc_val *svc;
	struct backend *be;
	__u32 bid = 0, *fl;

	if (d->proto != IPPROTO_TCP && d->proto != IPPROTO_UDP)
		return XLB_SYS_PROCEED;
	__builtin_memcpy(key.addr, d->addr, 16);
	key.port = d->port;
	key.proto = d->proto;
	key.family = d->family;
	svc = bpf_map_lookup_elem(&xlb_services, &key);
	if (!svc) {
		key.port = 0;
		svc = bpf_map_lookup_elem(&xlb_services, &key);
		if (!svc)
			return XLB_SYS_PROCEED;
	}
	/* stlsdnat maps a backend's replies back by the backend's address
	 * in the tc program, which would rewrite the replies to a socket
	 * that talks to the backend directly: those stay on the tc path. A
	 * local farm is served by the node's own sockets. */
	if (svc->mode == XLB_MODE_STLSDNAT || svc->mode == XLB_MODE_LOCAL)
		return XLB_SYS_PROCEED;
	/* intra-connect off (nftlb's): the node's own connections go where
	 * the node routes the address, untranslated. */
	fl = bpf_map_lookup_elem(&xlb_svc_flags, &svc->id);
	if (fl && (*fl & XLB_SVC_F_NOLOCAL))
		return XLB_SYS_PROCEED;
	/* Before the refusal of a service without backends, as kube-proxy's
	 * firewall check comes before its reject. */
	if (sock_denied(d)) {
		sock_stat(XLB_SOCK_STAT_DENIED);
		bpf_set_retval(-XLB_EPERM);
		return XLB_SYS_REJECT;
	}
	if (svc->slots == 0) {
		sock_stat(XLB_SOCK_STAT_REFUSED);
		bpf_set_retval(-XLB_ECONNREFUSED);
		return XLB_SYS_REJECT;
	}
	if (sticky) {
		__builtin_memcpy(fk.addr, d->addr, 16);
		fk.port = d->port;
		bid = sock_sticky(&fk, svc);
	}
	if (!bid) {
		/* The node as one client (zero source address), a new
		 * source port per connection. */
		__builtin_memcpy(p.k.dst, d->addr, 16);
		p.k.dport = d->port;
		p.k.sport = (__u16)bpf_get_prandom_u32();
		p.k.proto = d->proto;
		p.k.family = d->family;
		bid = lb4_pick(&p, svc, &key, bpf_ktime_get_coarse_ns());
	}
	be = bid ? bpf_map_lookup_elem(&xlb_backends, &bid) : NULL;
	if (!be) {
		sock_stat(XLB_SOCK_STAT_REFUSED);
		bpf_set_retval(-XLB_ECONNREFUSED);
		return XLB_SYS_REJECT;
	}
	__builtin_memcpy(rk.addr, be->addr, 16);
	rk.port = be->port ?: d->port;
	__builtin_memcpy(rv.addr, d->addr, 16);
	rv.port = d->port;
	/* A failed update only costs getpeername()/recvmsg() the service's
	 * address; the connection itself works. */
	bpf_map_update_elem(&xlb_sock_rev, &rk, &rv, BPF_ANY);
	if (sticky) {
		struct sock_fwd_val fv = { .port = rk.port };

		__builtin_memcpy(fv.addr, be->addr, 16);
		bpf_map_update_elem(&xlb_sock_fwd, &fk, &fv, BPF_ANY);
	}
	__builtin_memcpy(d->addr, be->addr, 16);
	d->port = rk.port;
	sock_stat(XLB_SOCK_STAT_XLATE);
	return XLB_SYS_PROCEED;
}

/**
 * sock_rev() - the service address @d (a backend's, as the socket sees
 * it) was translated from, if any; @d is rewritten to it.
 * Return: 1 if @d was rewritten, else 0.
 */
static __attribute__((noinline)) int sock_rev(struct sock_dst *d, __u64 cookie)
{
	struct sock_rev_key rk = { .cookie = cookie, .family = d->family, .port = d->port };
	struct sock_rev_val *rv;

	__builtin_memcpy(rk.addr, d->addr, 16);
	rv = bpf_map_lookup_elem(&xlb_sock_rev, &rk);
	if (!rv)
		return 0;
	__builtin_memcpy(d->addr, rv->addr, 16);
	d->port = rv->port;
	sock_stat(XLB_SOCK_STAT_REV);
	return 1;
}

/* The four-byte port field holds the port in network order in its first
 * two bytes (a little-endian load: the low half). */
static __always_inline __u16 sock_port(struct bpf_sock_addr *ctx) { return (__u16)ctx->user_port; }

static __always_inline void sock4_read(struct bpf_sock_addr *ctx, struct sock_dst *d)
{
	struct bpf_sock *sk = ctx->sk;

	d->addr[0] = ctx->user_ip4;
	d->port = sock_port(ctx);
	d->proto = ctx->protocol;
	d->family = XLB_AF_INET;
	if (sk)
		d->src[0] = sk->src_ip4;
}

static __always_inline void sock4_write(struct bpf_sock_addr *ctx, struct sock_dst *d)
{
	ctx->user_ip4 = d->addr[0];
	ctx->user_port = d->port;
}

/* An IPv6 socket reaches IPv4 addresses as ::ffff:a.b.c.d (a dual-stack
 * socket, the default of Go, Java and others): the connect6, sendmsg6,
 * recvmsg6 and getpeername6 hooks then see IPv4 services and backends in
 * that form. sock6_read() turns it into the IPv4 address, sock6_write()
 * back. */
static __always_inline void sock6_read(struct bpf_sock_addr *ctx, struct sock_dst *d)
{
	struct bpf_sock *sk = ctx->sk;

	d->addr[0] = ctx->user_ip6[0];
	d->addr[1] = ctx->user_ip6[1];
	d->addr[2] = ctx->user_ip6[2];
	d->addr[3] = ctx->user_ip6[3];
	d->port = sock_port(ctx);
	d->proto = ctx->protocol;
	d->family = XLB_AF_INET6;
	if (d->addr[0] == 0 && d->addr[1] == 0 && d->addr[2] == bpf_htonl(0xffff)) {
		d->addr[0] = d->addr[3];
		d->addr[2] = d->addr[3] = 0;
		d->family = XLB_AF_INET;
		d->mapped = 1;
	}
	if (sk) {
		__u32 s0 = sk->src_ip6[0], s1 = sk->src_ip6[1], s2 = sk->src_ip6[2],
		      s3 = sk->src_ip6[3];

		if (!d->mapped) {
			d->src[0] = s0;
			d->src[1] = s1;
			d->src[2] = s2;
			d->src[3] = s3;
		} else if (s0 == 0 && s1 == 0 && s2 == bpf_htonl(0xffff)) {
			d->src[0] = s3;
		}
	}
}

static __always_inline void sock6_write(struct bpf_sock_addr *ctx, struct sock_dst *d)
{
	if (d->mapped) {
		ctx->user_ip6[0] = 0;
		ctx->user_ip6[1] = 0;
		ctx->user_ip6[2] = bpf_htonl(0xffff);
		ctx->user_ip6[3] = d->addr[0];
	} else {
		ctx->user_ip6[0] = d->addr[0];
		ctx->user_ip6[1] = d->addr[1];
		ctx->user_ip6[2] = d->addr[2];
		ctx->user_ip6[3] = d->addr[3];
	}
	ctx->user_port = d->port;
}

/**
 * sock_fwd_hook() - connect and sendmsg: a service address is replaced by
 * the picked backend's. @v6 and @udp are constants at each call, so each
 * program keeps only its own family's context accesses.
 * Return: XLB_SYS_PROCEED, or sock_fwd()'s refusal.
 */
static __always_inline int sock_fwd_hook(struct bpf_sock_addr *ctx, int v6, int udp)
{
	struct sock_dst d = {};
	int rc;

	if (!sock_ours(ctx))
		return XLB_SYS_PROCEED;
	if (v6)
		sock6_read(ctx, &d);
	else
		sock4_read(ctx, &d);
	rc = sock_fwd(&d, bpf_get_socket_cookie(ctx), udp);
	if (rc == XLB_SYS_PROCEED) {
		if (v6)
			sock6_write(ctx, &d);
		else
			sock4_write(ctx, &d);
	}
	return rc;
}

/**
 * sock_rev_hook() - recvmsg and getpeername: a backend's address the
 * socket was sent to is shown as the service address it asked for.
 * Return: XLB_SYS_PROCEED.
 */
static __always_inline int sock_rev_hook(struct bpf_sock_addr *ctx, int v6)
{
	struct sock_dst d = {};

	if (!sock_ours(ctx))
		return XLB_SYS_PROCEED;
	if (v6)
		sock6_read(ctx, &d);
	else
		sock4_read(ctx, &d);
	if (sock_rev(&d, bpf_get_socket_cookie(ctx))) {
		if (v6)
			sock6_write(ctx, &d);
		else
			sock4_write(ctx, &d);
	}
	return XLB_SYS_PROCEED;
}

SEC("cgroup/connect4")
int xlb_sock_connect4(struct bpf_sock_addr *ctx) { return sock_fwd_hook(ctx, 0, 0); }

SEC("cgroup/sendmsg4")
int xlb_sock_sendmsg4(struct bpf_sock_addr *ctx) { return sock_fwd_hook(ctx, 0, 1); }

SEC("cgroup/recvmsg4")
int xlb_sock_recvmsg4(struct bpf_sock_addr *ctx) { return sock_rev_hook(ctx, 0); }

SEC("cgroup/getpeername4")
int xlb_sock_getpeername4(struct bpf_sock_addr *ctx) { return sock_rev_hook(ctx, 0); }

SEC("cgroup/connect6")
int xlb_sock_connect6(struct bpf_sock_addr *ctx) { return sock_fwd_hook(ctx, 1, 0); }

SEC("cgroup/sendmsg6")
int xlb_sock_sendmsg6(struct bpf_sock_addr *ctx) { return sock_fwd_hook(ctx, 1, 1); }

SEC("cgroup/recvmsg6")
int xlb_sock_recvmsg6(struct bpf_sock_addr *ctx) { return sock_rev_hook(ctx, 1); }

SEC("cgroup/getpeername6")
int xlb_sock_getpeername6(struct bpf_sock_addr *ctx) { return sock_rev_hook(ctx, 1); }
