package plan

// MaxWeightedSlots bounds a farm's weighted slot table: weights are scaled
// down to fit (see SlotRuns).
const MaxWeightedSlots = 16384

// WeightedSlots is the one weighted slot table of xlb: for each slot the
// index of its backend, backend i holding weights[i]/g slots in one run (g
// the weights' greatest common divisor), in order; when the total exceeds
// limit, every count is scaled down to fit (each backend keeping at least
// one slot). A scheduler that picks a slot uniformly (numgen random, a
// hash, a counter) then picks backends in proportion to their weights.
// The eBPF plane writes the slots to its slot map; the nftables plane
// writes each run as one interval of its backend map (SlotRuns). Nil
// without weights.
func WeightedSlots(weights []uint32, limit int) []int {
	var out []int
	for i, n := range SlotRuns(weights, limit) {
		for range n {
			out = append(out, i)
		}
	}
	return out
}

// SlotRuns returns, for each backend, the number of consecutive slots it
// holds in WeightedSlots(weights, limit).
func SlotRuns(weights []uint32, limit int) []int {
	if len(weights) == 0 {
		return nil
	}
	g := uint32(0)
	for _, w := range weights {
		g = gcd(g, w)
	}
	g = max(g, 1)
	total := 0
	for _, w := range weights {
		total += int(w / g)
	}
	out := make([]int, len(weights))
	for i, w := range weights {
		n := int(w / g)
		if total > limit {
			n = n * limit / total
		}
		out[i] = max(n, 1)
	}
	return out
}

func gcd(a, b uint32) uint32 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
