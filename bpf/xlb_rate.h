/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The rate limit both of the program's limits use: a table entry's limit
 * (xlb_tables.h) and a farm's new-rtlimit per client (xlb_climit.h).
 */
#ifndef XLB_RATE_H
#define XLB_RATE_H

#include <linux/bpf.h>

/**
 * rate_limited() - whether an event at @now (bpf_ktime_get_ns) goes past a
 * rate of one event every @iv ns with bursts of @tol / @iv + 1 events, by
 * the generic cell rate algorithm over one 64-bit word @tat (the
 * theoretical arrival time, advanced by @iv per admitted event with a
 * compare and exchange, so CPUs racing for the last token admit one event,
 * not two). It admits what nft's `limit rate N/unit burst B packets` admits
 * (a bucket of B tokens, one back every @iv): @tol = @iv * (B - 1).
 * Return: 1 to drop the event, 0 to admit it.
 */
static __always_inline int rate_limited(__u64 *tat, __u64 now, __u64 iv, __u64 tol)
{
	__u64 old, next;
	__u32 i;

	for (i = 0; i < 4; i++) {
		old = *(volatile __u64 *)tat;
		next = old > now ? old : now;
		if (next - now > tol)
			return 1;
		if (__sync_val_compare_and_swap(tat, old, next + iv) == old)
			return 0;
	}
	return 0; /* four CPUs raced: admit rather than spin */
}

#endif /* XLB_RATE_H */
