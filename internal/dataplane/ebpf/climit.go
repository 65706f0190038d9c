package ebpf

import (
	"math"

	"github.com/xlb-lb/xlb/internal/model"
)

// nftBurstDefault is the burst the kernel gives nft's `limit rate ...
// packets` without one (NFT_LIMIT_PKT_BURST_DEFAULT), and so the nft plane
// gives a farm's new-rtlimit of new-rtlimit-burst 0.
const nftBurstDefault = 5

// clientRate returns a farm's new-rtlimit as the program's rate_limited()
// (bpf/xlb_rate.h) takes it: ns between one client's new flows (the unit's
// ns / rate, truncated as the kernel's nft_limit does) and the tolerance,
// iv * (burst - 1), so it admits what nft's bucket of burst tokens admits.
// 0, 0: no limit.
func clientRate(rate uint32, unit model.RateUnit, burst uint32) (iv, tol uint64) {
	if rate == 0 {
		return 0, 0
	}
	if burst == 0 {
		burst = nftBurstDefault
	}
	iv = max(uint64(unit.Duration().Nanoseconds())/uint64(rate), 1)
	if uint64(burst-1) > math.MaxUint64/iv {
		return iv, math.MaxUint64
	}
	return iv, iv * uint64(burst-1)
}
