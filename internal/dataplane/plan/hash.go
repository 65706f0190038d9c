package plan

import (
	"cmp"
	"slices"

	"github.com/xlb-lb/xlb/internal/model"
)

// The hash scheduler is the flow hash (FlowSlot) of the farm's sched-param
// keys over the weighted slot table of its serving backends: the same
// jhash, seed (FlowSeed), register layout and scaling as maglev, so a flow
// goes to the same backend on both planes and on every node with the same
// backends. Unlike maglev it is not consistent: a backend coming or going
// changes the table's size, and most flows move (as nftlb's hash does).
//
// srcmac is the exception: nftables hashes the Ethernet source (ether
// saddr, padded to 8 bytes, after the other keys) but FlowSlot does not
// model it, and the eBPF plane refuses it. A source MAC is the last hop's,
// which differs from node to node, so no choice keyed on it can agree
// across nodes anyway.

// HashTable returns the slot table of the hash scheduler over the farm's
// serving backends (model.Farm.ActiveBackends, passed as active): for each
// slot the index in active of its backend, each backend holding a run of
// slots in proportion to its weight (SlotRuns, at most MaxWeightedSlots).
// The runs are laid out in the order of the backends' identity (address,
// then port), not of the list, so a node that lists the same backends in
// another order (EndpointSlices, API clients) builds the same table. A
// flow fl goes to active[t[FlowSlot(f.SchedParam, fl, len(t))]]. Nil when
// no backend serves.
func HashTable(active []model.Backend) []int {
	order := identityOrder(active)
	weights := make([]uint32, len(order))
	for i, bi := range order {
		weights[i] = active[bi].Weight
	}
	slots := WeightedSlots(weights, MaxWeightedSlots)
	for i, s := range slots {
		slots[i] = order[s]
	}
	return slots
}

// identityOrder returns the indexes of backends sorted by address, then
// port: the order in which a backend set is laid out whatever order it is
// listed in.
func identityOrder(backends []model.Backend) []int {
	order := make([]int, len(backends))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(x, y int) int {
		a, b := backends[x], backends[y]
		if c := a.Addr.Compare(b.Addr); c != 0 {
			return c
		}
		return cmp.Compare(a.Port, b.Port)
	})
	return order
}
