// Package nft is xlb's nftables data plane. docs/dataplane-nft.md describes
// every object and each mode's requirements; persist.go, helper.go and
// filterRules (rules.go) describe persistence, helpers and the per-farm
// filter chains; Maglev, weighted slots and the dual-family split come from
// package plan. It programs the kernel over netlink only (google/nftables),
// one batch per change, so every Apply and Reconcile is atomic in the
// kernel. The nft binary is never run here; tests use `nft list` as an
// oracle.
//
// # Files
//
// A farm's way in, in the order it is taken: plane.go (Plane, New, the
// tables), apply.go (Apply: split, cut by table, queue, send, commit) or
// reconcile.go (Reconcile), farm.go (putFarm, removeFarm: one farm into the
// batch), plan.go (planFarm: what the farm holds), placement.go (where it
// goes: table, chain kind, static sets), rules.go, sets.go, stateless.go,
// dsr.go, persist.go, limits.go, group.go (the rule and element builders),
// batch.go (the netlink transaction). shard.go is one table's state;
// check.go what the plane refuses.
//
// # Tables
//
// The daemon spreads farms over 32 tables, inet xlb-00 ... xlb-1f (Plane,
// --nft-tables), each a complete copy of the ruleset below holding the
// farms whose name hashes to it; a change is still one netlink batch over
// all of them. The kernel's cost of a commit grows with the tables it
// touches (set lookups by name walk a list; every chain reachable from a
// table's base chains is re-validated when a NAT rule or goto is added), so
// a change pays for about 1/32 of the farms: adding a farm with 100
// backends next to 10,000 farms took 32 ms in one table and 1.3 ms over 32
// tables (BenchmarkApplyAddFarm100Backends). xlb never touches a table it
// does not own.
//
// What sharding cannot remove (perf, kernel 6.18, 10,000 farms): every
// commit walks every chain of every table of the namespace
// (nf_tables_commit, "step 2. Make rules_gen_X visible"), one cache miss per
// chain; with the caches cold (an API call after a pause) that walk cost
// about 1 ms at 10,000 chains. So a farm has a chain only if it needs one:
// direct farms (one serving backend, single ports, no per-farm rules; see
// setDirect) share one chain per family and one map keyed VIP . protocol .
// port, and a table of them costs a commit nothing per farm. Farms with
// several backends need a rule each (round robin needs a numgen counter per
// farm), but most need no chain of their own: their rules share group
// chains of 16 farms (group.go). Deletes also pay the interval (pipapo)
// service maps' element removal.
//
// # Ruleset
//
// Each of xlb's tables (one, inet xlb, with --nft-tables 1):
//
//	table inet xlb {
//	  map svcx4 { type ipv4_addr . inet_proto . inet_service : verdict; }        single ports (and svcx6)
//	  set masqx4, map snatx4 (and IPv6): the same for the postrouting keys          (exactSet)
//	  map svc4  { type ipv4_addr . inet_proto . inet_service : verdict; flags interval; }
//	  map svc6  { type ipv6_addr . inet_proto . inet_service : verdict; flags interval; }
//	  set masq4 { type ipv4_addr . inet_proto . inet_service; flags interval; }   (and masq6)
//	  map snat4 { type ipv4_addr . inet_proto . inet_service : ipv4_addr; flags interval; } (and snat6)
//	  chain prerouting  { type nat hook prerouting priority dstnat
//	    ip daddr . meta l4proto . th dport vmap @svcx4
//	    ip6 daddr . meta l4proto . th dport vmap @svcx6
//	    ip daddr . meta l4proto . th dport vmap @svc4
//	    ip6 daddr . meta l4proto . th dport vmap @svc6 }
//	  chain output      { type nat hook output priority dstnat; the same four rules }
//	  chain postrouting { type nat hook postrouting priority srcnat
//	    snat ip to ct original ip daddr . meta l4proto . ct original proto-dst map @snatx4
//	    ct original ip daddr . meta l4proto . ct original proto-dst @masqx4 masquerade
//	    snat ip to ct original ip daddr . meta l4proto . ct original proto-dst map @snat4
//	    ct original ip daddr . meta l4proto . ct original proto-dst @masq4 masquerade
//	    (and the IPv6 forms) }
//	  chain f-<hash> { <scheduler> map @m-<hash>-<gen> -> dnat ; counter drop }   one per farm that needs one
//	  chain grp4-<n> { <farm match> <scheduler> map @m-... dnat comment "farm <name>" ... ; counter drop }
//	                                                                             up to 16 farms each (group.go)
//	  map m-<hash>-<gen> { slot : backend address [. port] }                      one per farm
//	  map dst4  { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service; } (and dst6)
//	  chain direct4 { dnat ip to ip daddr . meta l4proto . th dport map @dst4 ; counter drop } (and direct6)
//	}
//
// Direct farms have no f- chain or m- map: their svc elements goto direct4
// (direct6) and each virtual port has a dst4 (dst6) element. Grouped farms
// have an m- map but no f- chain: their svc elements goto their group chain.
//
// The base chains are static; everything that changes lives in sets, maps
// and per-farm chains. <hash> is 16 hex digits of SHA-256 of the farm name
// (farm names are up to 64 characters and may contain '.' and '-'; a hash
// keeps derived names short and uniform).
//
// Service maps use concatenations with intervals (the kernel's pipapo set
// type; each element carries a key and a key end): a farm's element per
// virtual port range is VIP . protocol . first-port to VIP . protocol .
// last-port. A farm without virtual ports covers ports 0-65535; protocol
// "all" covers protocols 0-255 (and every port). The verdict is a goto to the
// farm's chain. Single ports (one protocol, one port) go to the hash twins
// (svcx4, masqx4, snatx4; exactSet), looked up first: a pipapo map copies
// its tables on each change and removes an element in O(elements).
//
// Farm chains, by scheduler:
//
//	rr:     dnat ip to numgen inc mod N map @m          (slot i -> i-th active backend)
//	weight: dnat ip to numgen random mod W map @m       (interval map: weight-sized slot ranges;
//	                                                      numgen's result is turned to network
//	                                                      byte order first, as interval keys
//	                                                      compare as big-endian bytes)
//	hash:   dnat ip to jhash <keys> mod N seed S map @m (keys from sched-param: srcip, dstip,
//	                                                      srcport, dstport in that order; S is
//	                                                      plan.FlowSeed and the map holds
//	                                                      plan.HashTable, one element per slot:
//	                                                      the eBPF plane's choice, on any node)
//
// followed by a rule that drops, so a packet for a farm never falls through
// to local sockets. Only model.Farm.ActiveBackends get slots: up, weight >
// 0, at or below the farm's priority level (model.Farm.PriorityLevel). A farm with none has a chain that
// refuses new connections (TCP reset, else ICMP port unreachable). A farm
// whose state is not up has nothing in the
// kernel: its VIP is not handled.
//
// The backend map's data is address . port; when every active backend has
// port 0 it is address only and dnat keeps the client's destination port.
// A farm with one virtual port may mix both (port 0 then means that port);
// Check refuses the mix in farms with several ports or ranges.
//
// Modes: dnat only rewrites the destination (backends route replies through
// the LB). snat adds the VIP key to @masq4 (masquerade) or, with
// source-addr, to @snat4 (snat to that address). The postrouting key is
// taken from the conntrack entry's original direction, so no packet or
// connection mark is needed.
//
// Mode dsr lives in a netdev table of the same name next to each inet
// table (dsr.go): an ingress chain per interface in use, MAC rewrite and
// fwd. A family dual farm is programmed as two farms, one per VIP
// (plan.Halves). --conn-table-size sizes the kernel's conntrack (conntrack.go).
//
// # Changes
//
// Apply sends one batch per diff and lists nothing from the kernel: the
// plane remembers what it programmed per farm. Changing a farm rebuilds
// only that farm's chain rules and creates a new backend map with a fresh
// name (then deletes the old one), and adds or deletes only the service and
// snat elements that differ. Creating a new map rather than flushing and
// refilling the old one keeps every element operation simple (no flush and
// re-add of the same keys in one transaction, no map type changes in place)
// and costs the same, O(that farm's backends). Other farms' chains, maps and
// elements are not touched.
//
// Reconcile reads xlb's table (chains, sets, service and snat elements) and
// in one batch: ensures the table, static sets and base chains (replacing
// the base chains' rules), rebuilds every farm's chain and map, removes
// wrong and adds missing service/snat elements (never flushing those maps),
// and deletes chains and sets that belong to no farm. There is no moment
// where an existing farm is missing, and established connections keep their
// conntrack NAT bindings.
//
// Conntrack does the rest: nat chains only see the first packet of a
// connection, so changing a farm never moves existing connections (a
// backend set to weight 0 drains).
//
// # Limits
//
// A batch is one sendmsg and the kernel queues an ack per message, so the
// socket buffers are raised to 64 MiB (SO_SNDBUFFORCE/SO_RCVBUFFORCE, root).
// Elements are sent at most 200 per message (netlink attributes are < 64 KiB).
package nft
