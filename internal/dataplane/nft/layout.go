package nft

import (
	"fmt"
	"strings"

	"github.com/google/nftables"
)

// isLayoutTable reports whether name is one of xlb's table names for the
// table prefix: the prefix itself (--nft-tables 1) or prefix-XX, two
// lowercase hex digits (ShardTable).
func isLayoutTable(prefix, name string) bool {
	if name == prefix {
		return true
	}
	rest, ok := strings.CutPrefix(name, prefix+"-")
	if !ok || len(rest) != 2 {
		return false
	}
	for _, c := range rest {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// dropOtherLayouts deletes xlb's tables (inet and netdev) of another
// --nft-tables layout: those isLayoutTable names that are not in keep. A
// daemon restarted with another table count would otherwise leave its
// farms' old rules in the kernel, still balancing their VIPs, and still
// serving farms deleted since. It is called once a Reconcile has put every
// farm into the current tables, so no VIP goes unserved in between. It
// returns the tables it deleted.
func dropOtherLayouts(c *nftables.Conn, prefix string, keep map[string]bool) ([]string, error) {
	var dropped []string
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyNetdev} {
		tables, err := c.ListTablesOfFamily(fam)
		if err != nil {
			return nil, fmt.Errorf("list tables: %w", err)
		}
		for _, t := range tables {
			if isLayoutTable(prefix, t.Name) && !keep[t.Name] {
				c.DelTable(t)
				dropped = append(dropped, fmt.Sprintf("%s %s", familyName(fam), t.Name))
			}
		}
	}
	if len(dropped) == 0 {
		return nil, nil
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("delete tables of another --nft-tables layout (%s): %w", strings.Join(dropped, ", "), err)
	}
	return dropped, nil
}

func familyName(f nftables.TableFamily) string {
	if f == nftables.TableFamilyNetdev {
		return "netdev"
	}
	return "inet"
}
