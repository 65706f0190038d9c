package nft

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
)

// RemoveTables deletes every table of xlb's for the table prefix from the
// kernel of namespace ns (netns.None(): the current one): the farms'
// tables of any --nft-tables layout, inet and netdev, the named tables'
// table (inet <prefix>-tables), the counter table (inet
// <prefix>-counters) and the localhost NodePorts' guard (inet
// <prefix>-localnet, EnableLocalhostNodePorts), in one batch. It returns the
// tables it deleted ("inet xlb-03"). `xlb daemon --cleanup` and a daemon
// that starts on the eBPF plane call it; tables of other prefixes (the
// kube-proxy's xlb-kube) and of other programs are left alone.
func RemoveTables(ctx context.Context, ns netns.NsHandle, prefix string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := dialNFT(ns)
	if err != nil {
		return nil, err
	}
	defer c.CloseLasting()
	var gone []string
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyNetdev} {
		tables, err := c.ListTablesOfFamily(fam)
		if err != nil {
			return nil, fmt.Errorf("list tables: %w", err)
		}
		for _, t := range tables {
			if isLayoutTable(prefix, t.Name) || fam == nftables.TableFamilyINet && (t.Name == prefix+tablesSuffix || t.Name == prefix+countersSuffix || t.Name == prefix+localnetSuffix) {
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
	for i := range gone {
		gone[i] = "table " + gone[i]
	}
	return gone, nil
}
