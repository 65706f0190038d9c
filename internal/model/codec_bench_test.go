package model

import (
	"fmt"
	"strings"
	"testing"
)

// farmBody builds an nftlb POST body of one farm with n backends, values as
// strings the way nftlb clients send them.
func farmBody(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"farms":[{"name":"web","virtual-addr":"10.1.1.1","virtual-ports":"80","backends":[`)
	for j := range n {
		if j > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"b%d","ip-addr":"172.16.%d.1","port":"8080","weight":"1"}`, j, j)
	}
	b.WriteString("]}]}")
	return []byte(b.String())
}

// BenchmarkDecodeFarm100Backends is the model's share of one API call that
// adds a farm with 100 backends: decode, defaults, validation, sealing.
func BenchmarkDecodeFarm100Backends(b *testing.B) {
	body := farmBody(100)
	none := func(string) (*Farm, bool) { return nil, false }
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		farms, err := DecodeFarms(body, none)
		if err != nil {
			b.Fatal(err)
		}
		if err := farms[0].Validate(); err != nil {
			b.Fatal(err)
		}
		farms[0].Seal()
	}
}

// BenchmarkEncodeFarm100Backends is the encoding of a farm's journal
// record (and of its GET response): a farm of 100 backends into a new
// buffer.
func BenchmarkEncodeFarm100Backends(b *testing.B) {
	farms, err := DecodeFarms(farmBody(100), noFarm)
	if err != nil {
		b.Fatal(err)
	}
	f := &farms[0]
	b.SetBytes(int64(len(f.appendJSON(nil))))
	for b.Loop() {
		f.appendJSON(nil)
	}
}
