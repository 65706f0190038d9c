package ebpf

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestConstsMatchHeader checks the values mirrored in consts.go against
// bpf/xlb_consts.h, and statNames against enum xlb_stat.
func TestConstsMatchHeader(t *testing.T) {
	raw, err := os.ReadFile("../../../bpf/xlb_consts.h")
	if err != nil {
		t.Fatal(err)
	}
	src := string(raw)
	defs := map[string]int64{}
	for _, m := range regexp.MustCompile(`(?m)^#define (XLB_\w+) \(?(-?\d+)\)?`).FindAllStringSubmatch(src, -1) {
		v, _ := strconv.ParseInt(m[2], 10, 64)
		defs[m[1]] = v
	}
	for name, v := range map[string]int64{
		"XLB_MAX_SERVICES": maxServices, "XLB_MAX_SVC_IDS": maxSvcIDs, "XLB_MAX_BACKENDS": maxBackends,
		"XLB_MAX_SLOTS": maxSlots, "XLB_AF_INET": afInet, "XLB_AF_INET6": afInet6,
		"XLB_MODE_DNAT": modeDNAT, "XLB_MODE_SNAT": modeSNAT, "XLB_MODE_DSR": modeDSR, "XLB_MODE_STLSDNAT": modeSTL,
		"XLB_SCHED_RR": schedRR, "XLB_SCHED_WEIGHT": schedWeight, "XLB_SCHED_HASH": schedHash,
		"XLB_SCHED_SYMHASH": schedSymhash, "XLB_SCHED_MAGLEV": schedMaglev, "XLB_MAX_PERSIST": maxPersist,
		"XLB_HASH_SRCIP": hashSrcIP, "XLB_HASH_SRCPORT": hashSrcPort, "XLB_BE_F_GONE": beFlagGone, "XLB_SVC_F_LOG": svcFlagLog,
		"XLB_BE_SLOT_SHIFT": beSlotShift, "XLB_MAX_STAT_SLOTS": maxStatSlots,
		"XLB_CT_FWD": ctFwd, "XLB_CT_REPLY": ctReply,
		"XLB_CT_STATE_SYN": ctStateSYN, "XLB_CT_STATE_EST": ctStateEST, "XLB_CT_STATE_FIN": ctStateFIN,
		"XLB_CT_STATE_CLOSE": ctStateClose, "XLB_CT_STATE_UDP": ctStateUDP,
		"XLB_NEXT": verdictNext, "XLB_PASS": verdictPass, "XLB_DROP": verdictDrop, "XLB_REDIRECT": verdictRedirect,
	} {
		got, ok := defs[name]
		if !ok {
			t.Errorf("%s not defined in xlb_consts.h", name)
		} else if got != v {
			t.Errorf("%s = %d in xlb_consts.h, %d in consts.go", name, got, v)
		}
	}
	enum := src[strings.Index(src, "enum xlb_stat {"):]
	enum = enum[:strings.Index(enum, "};")]
	var stats []string
	for _, m := range regexp.MustCompile(`XLB_STAT_(\w+)`).FindAllStringSubmatch(enum, -1) {
		if m[1] != "MAX" {
			stats = append(stats, strings.ToLower(m[1]))
		}
	}
	if strings.Join(stats, ",") != strings.Join(statNames, ",") {
		t.Errorf("enum xlb_stat %v, statNames %v", stats, statNames)
	}
}
