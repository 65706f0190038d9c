// Package nft is xlb's nftables data plane. It programs the kernel over
// netlink only (google/nftables), one batch per change, so every Apply and
// Reconcile is atomic in the kernel. The nft binary is never run here; tests
// use `nft list` as an oracle.
//
// # Ruleset
//
// xlb owns one table, inet xlb (Options.Table), and never touches another:
//
//	table inet xlb {
//	  map svc4   { type ipv4_addr . inet_proto . inet_service : verdict; }                  exact keys
//	  map svc4r  { the same; flags interval; }                           port ranges, protocol "all"
//	  set masq4, masq4r { type ipv4_addr . inet_proto . inet_service; ... }
//	  map snat4, snat4r { type ipv4_addr . inet_proto . inet_service : ipv4_addr; ... }
//	  (and the IPv6 forms svc6, svc6r, masq6, masq6r, snat6, snat6r)
//	  map bk4-XX  { type integer : ipv4_addr }                     slot -> backend (port kept)
//	  map bk4p-XX { type integer : ipv4_addr . inet_service }      slot -> backend and port
//	  (and bk6-XX, bk6p-XX; XX is one of 256 shards, created when first used)
//	  chain prerouting  { type nat hook prerouting priority dstnat
//	    ip daddr . meta l4proto . th dport vmap @svc4     (then @svc4r, @svc6, @svc6r) }
//	  chain output      { type nat hook output priority dstnat; the same rules }
//	  chain postrouting { type nat hook postrouting priority srcnat
//	    snat ip to ct original ip daddr . meta l4proto . ct original proto-dst map @snat4
//	    ct original ip daddr . meta l4proto . ct original proto-dst @masq4 masquerade
//	    (and the interval and IPv6 forms) }
//	  chain f-<hash> { <scheduler> mod N offset B map @bk4p-XX -> dnat ; counter drop }  one per farm
//	}
//
// The base chains are static; everything that changes lives in maps and
// per-farm chains. <hash> is 16 hex digits of SHA-256 of the farm name
// (farm names are up to 64 characters and may contain '.' and '-'; a hash
// keeps derived names short and uniform).
//
// Why this shape (measured with perf on kernel 6.18, 10,000 farms): the
// kernel looks a table's sets up by name in a linear list, so a set per
// farm made every change O(farms) in name lookups (24 s to load 16,000
// farms); interval maps (pipapo) copy their whole lookup table on each
// commit, so exact keys live in hash maps and only ranges in the interval
// maps; and every rule that looks a map up binds to it, which costs a walk
// of the map's elements, and every new element is checked against every
// binding, so the backend maps are sharded 256 ways by farm name.
//
// Service maps: a farm's key per virtual port is VIP . protocol . port in
// svc4/svc6; port ranges, farms without virtual ports (ports 0-65535) and
// protocol "all" (protocols 0-255) use the interval maps (the kernel's pipapo
// set type; each element has a key and a key end). The verdict is a goto to
// the farm's chain.
//
// Backend maps: each farm owns a range of slots [B, B+N) in its shard map;
// its chain's scheduler yields a slot in that range ("numgen inc mod N
// offset B", "jhash ... mod N offset B") and the map gives the backend.
//
// Farm chains, by scheduler:
//
//	rr:     dnat ip to numgen inc mod N offset B map @bk     (slot B+i -> i-th active backend)
//	weight: dnat ip to numgen random mod W offset B map @bk  (each backend gets slots in proportion
//	                                                           to its weight: weights divided by
//	                                                           their gcd, at most 4096 slots, see
//	                                                           maxWeightSlots)
//	hash:   dnat ip to jhash <keys> mod N seed S offset B map @bk (keys from sched-param: srcip, dstip,
//	                                                      srcport, dstport in that order; the seed
//	                                                      is fixed per farm name, so rebuilds and
//	                                                      restarts keep clients on their backend)
//
// followed by a rule that drops, so a packet for a farm never falls through
// to local sockets. Only model.Farm.ActiveBackends get slots: up, weight >
// 0, lowest priority level with any. A farm with none has a chain that only
// drops new connections. A farm whose state is not up has nothing in the
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
// # Changes
//
// Apply sends one batch per diff and lists nothing from the kernel: the
// plane remembers what it programmed per farm. Changing a farm rebuilds
// only that farm's chain rules and its backend elements under a fresh slot
// range (then deletes the old range's elements), and adds or deletes only
// the service and snat elements that differ. A fresh range keeps every
// element operation simple (no delete and re-add of the same key) and the
// switch atomic: the batch that points the rule at the new range also adds
// it. Other farms' chains and elements are not touched. Slot ranges come
// from a 32-bit counter; before it would run out, Apply first compacts
// (reprograms every farm from slot 1 in one batch, as Reconcile does).
//
// Reconcile reads xlb's table (chains, sets, service, snat and backend
// elements) and in one batch: ensures the table, static sets and base
// chains (replacing the base chains' rules), rebuilds every farm's chain
// and backend elements from slot 1 up (deleting all old backend elements:
// a key deleted and added in one transaction is replaced), removes wrong
// and adds missing service/snat elements (never flushing those maps), and
// deletes chains and sets that belong to no farm. There is no moment where
// an existing farm is missing, and established connections keep their
// conntrack NAT bindings.
//
// Known cost: the kernel validates the whole table (every farm chain
// reachable from the base chains) in each commit that adds a NAT rule or
// a goto element, so adding a farm still costs O(farms) in the kernel:
// about 1 us per existing farm on this machine (see the README's
// performance section). Spreading farms over several tables would divide
// it; not done yet.
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
