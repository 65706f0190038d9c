package nft

import (
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
)

// RemoveTables deletes, in namespace ns (netns.None(): the caller's),
// every nftables table the plane makes with table prefix: its inet and
// netdev tables of any --nft-tables layout and its named tables' table
// (<prefix>-tables). It touches no other table. It returns what it deleted.
// For `--cleanup` (uninstall); a running plane's tables are gone with it.
func RemoveTables(ns netns.NsHandle, prefix string) ([]string, error) {
	var opts []nftables.ConnOption
	if ns >= 0 {
		opts = append(opts, nftables.WithNetNSFd(int(ns)))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("nftables connection: %w", err)
	}
	defer c.CloseLasting()
	var gone []string
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyNetdev} {
		tables, err := c.ListTablesOfFamily(fam)
		if err != nil {
			return nil, fmt.Errorf("list tables: %w", err)
		}
		for _, t := range tables {
			if isLayoutTable(prefix, t.Name) || fam == nftables.TableFamilyINet && t.Name == prefix+tablesSuffix {
				c.DelTable(t)
				gone = append(gone, familyName(fam)+" "+t.Name)
			}
		}
	}
	if len(gone) == 0 {
		return nil, nil
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("delete tables %s: %w", strings.Join(gone, ", "), err)
	}
	return gone, nil
}
