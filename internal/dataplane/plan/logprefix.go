package plan

import (
	"strings"

	"github.com/xlb-lb/xlb/internal/model"
)

// MaxLogPrefix is the kernel's limit of a log prefix (NF_LOG_PREFIXLEN less
// the NUL): an expanded prefix is cut to it.
const MaxLogPrefix = 127

// DefaultFarmLogPrefix is nftlb's log-prefix of a farm's own log lines.
const DefaultFarmLogPrefix = "TYPE-FNAME "

// LogPrefix expands nftlb's tokens in a log prefix, as nftlb does: KNAME
// (the kind of line: "log" for a farm's own lines, a limit's name for a
// limit's), TYPE (the hook of a farm's own line: IN, FWD or OUT; left as it
// is when typ is empty), FNAME (the farm) and BNAME (the backend; only when
// backend is set). The result is cut to MaxLogPrefix bytes.
func LogPrefix(prefix, kname, typ, farm, backend string) string {
	tokens := []string{"KNAME", kname, "FNAME", farm}
	if typ != "" {
		tokens = append(tokens, "TYPE", typ)
	}
	if backend != "" {
		tokens = append(tokens, "BNAME", backend)
	}
	p := strings.NewReplacer(tokens...).Replace(prefix)
	if len(p) > MaxLogPrefix {
		p = p[:MaxLogPrefix]
	}
	return p
}

// logTypes are nftlb's TYPE of each hook of a farm's log, in the order the
// lines are written. (nftlb 1.0.7 writes IN and FWD lines and programs
// nothing for output; OUT is xlb's.)
var logTypes = []struct {
	hook model.LogHook
	typ  string
}{{model.LogInput, "IN"}, {model.LogForward, "FWD"}, {model.LogOutput, "OUT"}}

// FarmLogPrefixes returns the prefixes of a farm's own log lines: one for
// each hook of its log (input, forward, output), its log-prefix (nftlb's
// default "TYPE-FNAME " when empty) with KNAME "log", that hook's TYPE and
// the farm's name expanded. Both data planes write a new connection's lines
// with these prefixes.
func FarmLogPrefixes(f *model.Farm) []string {
	prefix := f.LogPrefix
	if prefix == "" {
		prefix = DefaultFarmLogPrefix
	}
	var out []string
	for _, t := range logTypes {
		if f.Log&t.hook != 0 {
			out = append(out, LogPrefix(prefix, "log", t.typ, f.Name, ""))
		}
	}
	return out
}
