/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Header rewrites with incremental checksum updates, and the hash of the
 * hash scheduler. The kernel's csum helpers handle both CHECKSUM_PARTIAL
 * (offloaded, as from local veth senders) and complete checksums.
 */
#ifndef XLB_CSUM_H
#define XLB_CSUM_H

#include <linux/bpf.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#include "xlb_parsing.h"

/* csum16_replace() - RFC 1624 incremental update of the one's complement
 * checksum *sum for a 16-bit word changing from @from to @to (any byte
 * order, as long as all three agree). */
static __always_inline void csum16_replace(__u16 *sum, __u16 from, __u16 to)
{
	__u32 s = (__u16) ~*sum;

	s += (__u16)~from;
	s += to;
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	*sum = ~s;
}

static __always_inline void csum32_replace(__u16 *sum, __u32 from, __u32 to)
{
	csum16_replace(sum, from & 0xffff, to & 0xffff);
	csum16_replace(sum, from >> 16, to >> 16);
}

/* seed32_replace() - the same for the seed a CHECKSUM_PARTIAL packet holds
 * in its TCP/UDP checksum field (the folded pseudo-header sum, not
 * complemented; the device or the stack completes it), as the kernel's
 * inet_proto_csum_replace4() does. */
static __always_inline void seed32_replace(__u16 *sum, __u32 from, __u32 to)
{
	__u32 s = *sum;

	s += (__u16) ~(from & 0xffff);
	s += (__u16) ~(from >> 16);
	s += to & 0xffff;
	s += to >> 16;
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	*sum = s;
}

/* ip4_set_dscp() - give the IPv4 header @ip the DSCP @dscp (the TOS
 * byte's high 6 bits), its ECN bits kept, the header checksum updated over
 * the 16-bit word the byte is in. No TCP/UDP checksum covers it. */
static __always_inline void ip4_set_dscp(struct iphdr *ip, __u8 dscp)
{
	__u16 *w = (__u16 *)ip; /* version, IHL and TOS */
	__u16 old = *w;

	ip->tos = (__u8)(dscp << 2) | (ip->tos & 3);
	csum16_replace(&ip->check, old, *w);
}

/* ip6_set_dscp() - give the IPv6 header @ip6 the DSCP @dscp: the traffic
 * class's high 6 bits, which straddle its first two bytes (4 in vtc, 2 in
 * tc_flow); its ECN bits and the flow label kept. No checksum covers it. */
static __always_inline void ip6_set_dscp(struct xlb_ipv6hdr *ip6, __u8 dscp)
{
	ip6->vtc = (ip6->vtc & 0xf0) | ((dscp >> 2) & 0x0f);
	ip6->tc_flow = (ip6->tc_flow & 0x3f) | (__u8)((dscp & 3) << 6);
}

/* skb->ip_summed. */
#define XLB_CHECKSUM_NONE 0
#define XLB_CHECKSUM_UNNECESSARY 1
#define XLB_CHECKSUM_COMPLETE 2
#define XLB_CHECKSUM_PARTIAL 3

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

/* The one field of struct sk_buff we read (CO-RE: relocated against the
 * running kernel's BTF). */
struct sk_buff___xlb {
	__u8 ip_summed : 2;
} __attribute__((preserve_access_index));

/* xlb_ip_summed() - the skb's checksum state (CHECKSUM_*), which
 * struct __sk_buff does not show. */
static __always_inline int xlb_ip_summed(struct __sk_buff *skb)
{
	struct sk_buff___xlb *k = bpf_cast_to_kern_ctx(skb);

	return BPF_CORE_READ_BITFIELD(k, ip_summed);
}

/**
 * lb6_rewrite() - lb4_rewrite() for IPv6: no IP header checksum; with a
 * complete checksum, the address change goes into the TCP/UDP checksum as
 * one difference (bpf_csum_diff over both addresses).
 */
static __always_inline int lb6_rewrite(struct __sk_buff *skb, struct pkt *p, struct ct_val *v,
				       const __u8 *dmac, const __u8 *smac)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	__u32 l4off = p->l4off & 0x7f;
	struct ethhdr *eth = data;
	struct xlb_ipv6hdr *ip6 = data + sizeof(struct ethhdr);
	__u16 *ports = data + l4off;
	__u32 csum_off = l4off;
	__u64 l4f = 0;
	int addrs, err = 0, summed;
	__s64 diff;

	if ((void *)(ip6 + 1) > end || (void *)(ports + 2) > end)
		return -1;
	if (p->k.proto == IPPROTO_TCP) {
		csum_off += __builtin_offsetof(struct tcphdr, check);
	} else {
		csum_off += __builtin_offsetof(struct udphdr, check);
		l4f = BPF_F_MARK_MANGLED_0;
	}
	if (dmac) {
		__builtin_memcpy(eth->h_dest, dmac, 6);
		__builtin_memcpy(eth->h_source, smac, 6);
		ip6->hop_limit = p->ttl - 1;
	}
	addrs = !addr_eq(v->src, p->k.src) || !addr_eq(v->dst, p->k.dst);
	__builtin_memcpy(ip6->saddr, v->src, 16);
	__builtin_memcpy(ip6->daddr, v->dst, 16);
	ports[0] = v->sport;
	ports[1] = v->dport;

	summed = xlb_ip_summed(skb);
	if (summed != XLB_CHECKSUM_COMPLETE) {
		/* Inline, as in lb4_rewrite(). */
		__u16 *sum = data + (csum_off & 0xff);
		int i;

		if ((void *)(sum + 1) > end)
			return -1;
		if (l4f && !*sum)
			return 0;
		for (i = 0; i < 4; i++) {
			if (summed == XLB_CHECKSUM_PARTIAL) {
				seed32_replace(sum, p->k.src[i], v->src[i]);
				seed32_replace(sum, p->k.dst[i], v->dst[i]);
			} else {
				csum32_replace(sum, p->k.src[i], v->src[i]);
				csum32_replace(sum, p->k.dst[i], v->dst[i]);
			}
		}
		if (summed != XLB_CHECKSUM_PARTIAL) {
			csum16_replace(sum, p->k.sport, v->sport);
			csum16_replace(sum, p->k.dport, v->dport);
		}
		if (l4f && !*sum)
			*sum = 0xffff;
		return 0;
	}

	/* Packet pointers are invalid from here on. */
	if (addrs) {
		/* src and dst are adjacent in both struct ct_key and ct_val. */
		diff = bpf_csum_diff(p->k.src, 32, v->src, 32, 0);
		if (diff < 0)
			return (int)diff;
		err = bpf_l4_csum_replace(skb, csum_off, 0, (__u32)diff, l4f | BPF_F_PSEUDO_HDR);
	}
	if (!err && v->sport != p->k.sport)
		err = bpf_l4_csum_replace(skb, csum_off, p->k.sport, v->sport, l4f | 2);
	if (!err && v->dport != p->k.dport)
		err = bpf_l4_csum_replace(skb, csum_off, p->k.dport, v->dport, l4f | 2);
	return err;
}

/**
 * lb4_rewrite() - rewrite a packet's IPv4 tuple to the conntrack value's,
 * and, when forwarding it ourselves, its TTL and MAC addresses.
 * @skb: the packet
 * @p: its parsed tuple
 * @v: the tuple to leave with
 * @dmac: NULL, or the destination MAC to write; then also @smac is written
 *        and the TTL decremented (we forward the packet ourselves)
 * @smac: the source MAC
 *
 * The Ethernet and IPv4 headers are written directly (the IPv4 checksum
 * updated in place); the TCP/UDP checksum goes through the kernel's
 * bpf_l4_csum_replace(), which knows whether the skb carries a complete or
 * an offloaded (CHECKSUM_PARTIAL, as from local veth senders) checksum. A
 * UDP checksum of zero, "none", stays zero.
 *
 * Return: 0, or a negative error (packet too short, helper failure).
 */
static __always_inline int lb4_rewrite(struct __sk_buff *skb, struct pkt *p, struct ct_val *v,
				       const __u8 *dmac, const __u8 *smac)
{
	if (p->k.family == XLB_AF_INET6)
		return lb6_rewrite(skb, p, v, dmac, smac);

	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	__u32 l4off = p->l4off & 0x7f; /* <= 14 + 60: bounded for the verifier */
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(struct ethhdr);
	__u16 *ports = data + l4off;
	__u32 csum_off = l4off;
	__u64 l4f = 0;
	int err = 0, summed;

	if ((void *)(ip + 1) > end || (void *)(ports + 2) > end)
		return -1;
	if (p->k.proto == IPPROTO_TCP) {
		csum_off += __builtin_offsetof(struct tcphdr, check);
	} else {
		csum_off += __builtin_offsetof(struct udphdr, check);
		l4f = BPF_F_MARK_MANGLED_0;
	}

	if (dmac) {
		__u16 nw = p->ttl_word;

		__builtin_memcpy(eth->h_dest, dmac, 6);
		__builtin_memcpy(eth->h_source, smac, 6);
		((__u8 *)&nw)[0] = p->ttl - 1;
		ip->ttl = p->ttl - 1;
		csum16_replace(&ip->check, p->ttl_word, nw);
	}
	if (v->src[0] != p->k.src[0]) {
		ip->saddr = v->src[0];
		csum32_replace(&ip->check, p->k.src[0], v->src[0]);
	}
	if (v->dst[0] != p->k.dst[0]) {
		ip->daddr = v->dst[0];
		csum32_replace(&ip->check, p->k.dst[0], v->dst[0]);
	}
	ports[0] = v->sport;
	ports[1] = v->dport;

	/* The TCP/UDP checksum, inline unless the skb carries a complete
	 * checksum (skb->csum would need the update too: the helper does it). */
	summed = xlb_ip_summed(skb);
	if (summed != XLB_CHECKSUM_COMPLETE) {
		__u16 *sum = data + (csum_off & 0xff);

		if ((void *)(sum + 1) > end)
			return -1;
		if (l4f && !*sum)
			return 0; /* UDP without checksum */
		if (summed == XLB_CHECKSUM_PARTIAL) {
			/* Only the pseudo header is in the seed. */
			seed32_replace(sum, p->k.src[0], v->src[0]);
			seed32_replace(sum, p->k.dst[0], v->dst[0]);
		} else {
			csum32_replace(sum, p->k.src[0], v->src[0]);
			csum32_replace(sum, p->k.dst[0], v->dst[0]);
			csum16_replace(sum, p->k.sport, v->sport);
			csum16_replace(sum, p->k.dport, v->dport);
		}
		if (l4f && !*sum)
			*sum = 0xffff; /* CSUM_MANGLED_0: 0 would mean "none" */
		return 0;
	}

	/* Packet pointers are invalid from here on. */
	if (v->src[0] != p->k.src[0])
		err = bpf_l4_csum_replace(skb, csum_off, p->k.src[0], v->src[0],
					  l4f | BPF_F_PSEUDO_HDR | 4);
	if (!err && v->dst[0] != p->k.dst[0])
		err = bpf_l4_csum_replace(skb, csum_off, p->k.dst[0], v->dst[0],
					  l4f | BPF_F_PSEUDO_HDR | 4);
	if (!err && v->sport != p->k.sport)
		err = bpf_l4_csum_replace(skb, csum_off, p->k.sport, v->sport, l4f | 2);
	if (!err && v->dport != p->k.dport)
		err = bpf_l4_csum_replace(skb, csum_off, p->k.dport, v->dport, l4f | 2);
	return err;
}

/* jhash (Bob Jenkins' lookup3, as in the kernel's linux/jhash.h). */
#define XLB_JHASH_INITVAL 0xdeadbeef

static __always_inline __u32 xlb_rol32(__u32 w, __u32 s) { return (w << s) | (w >> (32 - s)); }

static __always_inline __u32 xlb_jhash_3words(__u32 a, __u32 b, __u32 c, __u32 initval)
{
	a += XLB_JHASH_INITVAL;
	b += XLB_JHASH_INITVAL;
	c += initval;
	c ^= b;
	c -= xlb_rol32(b, 14);
	a ^= c;
	a -= xlb_rol32(c, 11);
	b ^= a;
	b -= xlb_rol32(a, 25);
	c ^= b;
	c -= xlb_rol32(b, 16);
	a ^= c;
	a -= xlb_rol32(c, 4);
	b ^= a;
	b -= xlb_rol32(a, 14);
	c ^= b;
	c -= xlb_rol32(b, 24);
	return c;
}

/* The kernel's __jhash_mix and __jhash_final (linux/jhash.h). */
#define XLB_JHASH_MIX(a, b, c)         \
	do {                           \
		a -= c;                \
		a ^= xlb_rol32(c, 4);  \
		c += b;                \
		b -= a;                \
		b ^= xlb_rol32(a, 6);  \
		a += c;                \
		c -= b;                \
		c ^= xlb_rol32(b, 8);  \
		b += a;                \
		a -= c;                \
		a ^= xlb_rol32(c, 16); \
		c += b;                \
		b -= a;                \
		b ^= xlb_rol32(a, 19); \
		a += c;                \
		c -= b;                \
		c ^= xlb_rol32(b, 4);  \
		b += a;                \
	} while (0)

#define XLB_JHASH_FINAL(a, b, c)       \
	do {                           \
		c ^= b;                \
		c -= xlb_rol32(b, 14); \
		a ^= c;                \
		a -= xlb_rol32(c, 11); \
		b ^= a;                \
		b -= xlb_rol32(a, 25); \
		c ^= b;                \
		c -= xlb_rol32(b, 16); \
		a ^= c;                \
		a -= xlb_rol32(c, 4);  \
		b ^= a;                \
		b -= xlb_rol32(a, 14); \
		c ^= b;                \
		c -= xlb_rol32(b, 24); \
	} while (0)

/**
 * xlb_flow_hash() - the flow hash of the maglev scheduler (plan.FlowSlot in
 * Go): the kernel's jhash(key, len, XLB_HASH_SEED) over source address,
 * destination address, source port and destination port, each padded to
 * 4 bytes (a port is its two bytes in network order, then two zero bytes),
 * which is what the nftables plane's `jhash ip saddr . ip daddr . th sport .
 * th dport seed ...` hashes over its registers. So both planes send a flow
 * to the same slot of the same table. A key of 16 bytes (IPv4) is one
 * jhash block and a 4-byte tail, one of 40 bytes (IPv6) three blocks and a
 * tail. Little-endian only, like the rest of the program.
 * @k: the packet's tuple.
 * Return: the 32-bit hash.
 */
static __always_inline __u32 xlb_flow_hash(const struct ct_key *k)
{
	__u32 a, b, c;

	if (k->family == XLB_AF_INET) {
		a = b = c = XLB_JHASH_INITVAL + 16 + XLB_HASH_SEED;
		a += k->src[0];
		b += k->dst[0];
		c += k->sport;
		XLB_JHASH_MIX(a, b, c);
		a += k->dport;
		XLB_JHASH_FINAL(a, b, c);
		return c;
	}
	a = b = c = XLB_JHASH_INITVAL + 40 + XLB_HASH_SEED;
	a += k->src[0];
	b += k->src[1];
	c += k->src[2];
	XLB_JHASH_MIX(a, b, c);
	a += k->src[3];
	b += k->dst[0];
	c += k->dst[1];
	XLB_JHASH_MIX(a, b, c);
	a += k->dst[2];
	b += k->dst[3];
	c += k->sport;
	XLB_JHASH_MIX(a, b, c);
	a += k->dport;
	XLB_JHASH_FINAL(a, b, c);
	return c;
}

/* xlb_scale() - @h onto [0, @n), as the kernel's reciprocal_scale (what
 * nft's jhash expression does with its modulus). */
static __always_inline __u32 xlb_scale(__u32 h, __u32 n) { return (__u32)(((__u64)h * n) >> 32); }

#endif /* XLB_CSUM_H */
