// Package modeltest generates farm requests for property tests: random
// subsets of fields with values drawn from pools of valid and invalid
// ones, text full of edge cases (invalid UTF-8, escapes, control
// characters, multi-byte characters at the length limits).
package modeltest

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// text values as JSON text (quotes and escapes included), for text fields.
var texts = []string{
	`""`, `"web"`, `"web: "`, `"` + strings.Repeat("x", 24) + `"`, `"` + strings.Repeat("x", 25) + `"`,
	`"` + strings.Repeat("é", 12) + `"`, `"` + strings.Repeat("é", 13) + `"`, `"\u00e9\u4e2d"`,
	"\"" + strings.Repeat("\xff", 24) + "\"", "\"a\xc3\"", `"\ud800"`, `"\ud83d\ude00"`, `"a\u0000b"`,
	`"tab\there"`, `"\"quoted\""`, `"back\\slash"`, `"\u2028"`, `"日本語のログ"`, "\"\xe2\x82\"",
}

// randomVIP in a pool stands for a random IPv4 address in 10.0.0.0/14,
// so that farms seldom clash on one listener.
const randomVIP = "random-vip"

// pools of values (JSON text) per field.
var farmPools = map[string][]string{
	"family":            {`"ipv4"`, `"ipv6"`, `"dual"`},
	"virtual-addr":      {randomVIP, randomVIP, randomVIP, `"10.0.0.1"`, `"10.0.0.2"`, `"10.0.0.5"`, `"10.0.0.6"`, `"fd00::1"`, `"10.0.0.3,fd00::3"`, `"0.0.0.0"`, `" 10.0.0.4"`, `"224.0.0.1"`, `""`},
	"virtual-ports":     {`"80"`, `"80,443"`, `"1000-2000"`, `""`, `8080`, `"0"`},
	"source-addr":       {`""`, `"10.9.9.9"`, `"fd00::9"`},
	"mode":              {`"snat"`, `"dnat"`, `"dsr"`, `"stlsdnat"`},
	"protocol":          {`"tcp"`, `"udp"`, `"sctp"`, `"all"`},
	"scheduler":         {`"rr"`, `"weight"`, `"hash"`, `"symhash"`, `"maglev"`, `"lc"`, `"wlc"`},
	"sched-param":       {`"srcip"`, `"srcip dstport"`, `"none"`},
	"persistence":       {`"none"`, `"srcip"`, `"srcip-srcport"`},
	"persist-ttl":       {`"60"`, `120`, `"0"`},
	"helper":            {`"none"`, `"ftp"`, `"tftp"`, `"sip"`},
	"log":               {`"none"`, `"input"`, `"input forward"`},
	"mark":              {`"0x0"`, `"0x10"`, `16`},
	"priority":          {`"1"`, `"7"`},
	"state":             {`"up"`, `"down"`, `"off"`},
	"new-rtlimit":       {`"0"`, `"100"`},
	"est-connlimit":     {`"0"`, `"50"`},
	"tcp-strict":        {`"on"`, `"off"`, `true`},
	"iface":             {`""`, `"eth0"`, `"veth-é"`},
	"ether-addr":        {`""`, `"02:00:00:00:00:01"`},
	"log-prefix":        texts,
	"new-rtlimit-burst": {`"0"`, `"10"`},
}

var backendPools = map[string][]string{
	"ip-addr":       {`"10.1.0.1"`, `"10.1.0.2"`, `"10.1.0.3"`, `"fd00:1::1"`, `"0.0.0.0"`, `"255.255.255.255"`},
	"port":          {`""`, `"80"`, `8080`},
	"weight":        {`"1"`, `"0"`, `3`},
	"priority":      {`"1"`, `"2"`},
	"mark":          {`"0x0"`, `"0x20"`},
	"est-connlimit": {`"0"`, `"9"`},
	"state":         {`"up"`, `"down"`, `"off"`},
	"ether-addr":    {`""`, `"02:00:00:00:00:02"`},
}

// FarmJSON returns one random farm object named name as JSON. Many are
// refused by validation; those accepted cover the fields' corners.
func FarmJSON(r *rand.Rand, name string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"name":%q`, name)
	addFields(r, &b, farmPools)
	if r.IntN(3) > 0 {
		b.WriteString(`,"backends":[`)
		n := r.IntN(4)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			bname := fmt.Sprintf("b%d", i)
			if r.IntN(8) == 0 {
				bname = "b" + texts[r.IntN(len(texts))]
				bname = strings.Trim(bname, `"`)
			}
			fmt.Fprintf(&b, `{"name":"%s"`, bname)
			addFields(r, &b, backendPools)
			b.WriteByte('}')
		}
		b.WriteByte(']')
	}
	b.WriteByte('}')
	return b.String()
}

func addFields(r *rand.Rand, b *strings.Builder, pools map[string][]string) {
	// Sorted keys: the same seed gives the same object.
	keys := make([]string, 0, len(pools))
	for k := range pools {
		keys = append(keys, k)
	}
	for i := range keys {
		for j := i + 1; j < len(keys); j++ {
			if keys[j] < keys[i] {
				keys[i], keys[j] = keys[j], keys[i]
			}
		}
	}
	for _, k := range keys {
		if k == "ip-addr" || k == "virtual-addr" || r.IntN(6) == 0 {
			pool := pools[k]
			v := pool[r.IntN(len(pool))]
			if v == randomVIP {
				v = fmt.Sprintf(`"10.%d.%d.%d"`, r.IntN(4), r.IntN(256), 1+r.IntN(254))
			}
			fmt.Fprintf(b, `,%q:%s`, k, v)
		}
	}
}
