package model

import "strconv"

// StatsListingHeader is the header of the listing with counters (`xlb list
// --stats`, GET /farms?format=ipvsadm&stats=1), as `ipvsadm -L --stats
// --exact` prints it.
const StatsListingHeader = "Prot LocalAddress:Port               Conns   InPkts  OutPkts  InBytes OutBytes\n" +
	"  -> RemoteAddress:Port\n"

// RateListingHeader is the header of the listing with rates (`xlb list
// --rate`, GET /farms?format=ipvsadm&rate=1), as `ipvsadm -L --rate`
// prints it; its lines are AppendStatsListing's with rates per second.
const RateListingHeader = "Prot LocalAddress:Port" + "           " +
	"      CPS    InPPS   OutPPS    InBPS   OutBPS\n" +
	"  -> RemoteAddress:Port\n"

// ListingCounters are the numbers of one line of the stats listing:
// connections, packets in, packets out, bytes in, bytes out.
type ListingCounters [5]uint64

// AppendStatsListing appends the farm's lines of the stats listing: the
// farm's counters, then one line per backend (backends[i] is
// f.Backends[i]'s; missing ones are zero).
//
//	TCP  10.0.0.1:80                        12       60       36     3216     2220
//	  -> 10.200.0.11:8080                    4       20       12     1072      740
func (f *Farm) AppendStatsListing(dst []byte, numeric bool, farm ListingCounters, backends []ListingCounters) []byte {
	var svc serviceLookup
	if !numeric {
		svc = lookupService
	}
	col := f.appendFarmColumn(nil, svc)
	dst = appendCounters(appendPadded(dst, col, 33), farm)
	for i := range f.Backends {
		b := &f.Backends[i]
		col = f.appendBackendColumn(col[:0], b, svc)
		var c ListingCounters
		if i < len(backends) {
			c = backends[i]
		}
		dst = append(dst, "  -> "...)
		dst = appendCounters(appendPadded(dst, col, 28), c)
	}
	return dst
}

func appendCounters(dst []byte, c ListingCounters) []byte {
	for _, v := range c {
		dst = append(dst, ' ')
		dst = appendPadLeft(dst, strconv.AppendUint(nil, v, 10), 8)
	}
	return append(dst, '\n')
}

func appendPadLeft(dst, s []byte, width int) []byte {
	for i := len(s); i < width; i++ {
		dst = append(dst, ' ')
	}
	return append(dst, s...)
}
