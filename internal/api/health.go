package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/events"
	"github.com/xlb-lb/xlb/internal/health"
	"github.com/xlb-lb/xlb/internal/model"
)

// CheckStatus gives the last check of a checked backend: the health
// monitor.
type CheckStatus interface {
	Status(farm, backend string) (health.Status, bool)
}

// SetChecks makes GET /farms/{name} show each checked backend's last
// check from c.
func (s *Server) SetChecks(c CheckStatus) { s.checks = c }

// SetEvents makes GET /events stream the events of b.
func (s *Server) SetEvents(b *events.Broker) { s.events = b }

// writeFarm sends one farm as GET /farms/{name} shows it: the
// configuration, and for each backend its health (up, down or unchecked),
// the weight the data plane has, and its last check. Those members are
// read-only: a PUT of the same body ignores them. A farm without checks
// is shown exactly as GET /farms dumps it (nftlb's form).
func (s *Server) writeFarm(w http.ResponseWriter, f *model.Farm) {
	if !f.HasChecks() {
		writeFarms(w, []*model.Farm{f})
		return
	}
	hs, _ := s.eng.FarmHealth(f)
	buf := make([]byte, 0, f.JSONLen()+len(f.Backends)*160+16)
	buf = append(buf, `{"farms":[`...)
	buf = f.AppendJSONExtra(buf, func(dst []byte, i int) []byte {
		h := hs[i]
		dst = append(dst, `,"health":`...)
		dst = strconv.AppendQuote(dst, h.State)
		dst = append(dst, `,"effective-weight":"`...)
		dst = strconv.AppendUint(dst, uint64(h.Weight), 10)
		dst = append(dst, '"')
		if h.State == engine.HealthUnchecked || s.checks == nil {
			return dst
		}
		st, ok := s.checks.Status(f.Name, f.Backends[i].Name)
		if !ok {
			return dst
		}
		dst = append(dst, `,"last-check":{`...)
		if st.Checked {
			result := "pass"
			if !st.Last.OK {
				result = "fail"
			}
			dst = append(dst, `"result":"`...)
			dst = append(dst, result...)
			dst = append(dst, `","reason":`...)
			dst = strconv.AppendQuote(dst, st.Last.Detail)
			dst = append(dst, `,"time":"`...)
			dst = st.Last.Start.UTC().AppendFormat(dst, time.RFC3339Nano)
			dst = append(dst, `","duration":"`...)
			dst = append(dst, st.Last.Took.Round(time.Microsecond).String()...)
			dst = append(dst, `",`...)
		} else {
			dst = append(dst, `"result":"none",`...)
		}
		for _, kv := range []struct {
			k string
			v uint64
		}{{"checks", st.Checks}, {"failures", st.Fails}, {"streak", uint64(st.Streak)}, {"downs", h.Downs}, {"ups", h.Ups}} {
			dst = append(dst, '"')
			dst = append(dst, kv.k...)
			dst = append(dst, `":"`...)
			dst = strconv.AppendUint(dst, kv.v, 10)
			dst = append(dst, `",`...)
		}
		dst = append(dst, `"since":"`...)
		if !h.Since.IsZero() {
			dst = h.Since.UTC().AppendFormat(dst, time.RFC3339Nano)
		}
		dst = append(dst, '"')
		if h.Reason != "" {
			dst = append(dst, `,"transition-reason":`...)
			dst = strconv.AppendQuote(dst, h.Reason)
		}
		return append(dst, '}')
	})
	buf = append(buf, "]}\n"...)
	writeJSON(w, http.StatusOK, buf)
}

// appendListing appends a farm's lines of the ipvsadm-style table, with
// the health of checked backends at the end of their lines.
func (s *Server) appendListing(buf []byte, f *model.Farm, numeric bool) []byte {
	if !f.HasChecks() {
		return f.AppendListing(buf, numeric)
	}
	hs, _ := s.eng.FarmHealth(f)
	return f.AppendListingExtra(buf, numeric, func(i int) string { return engine.HealthSuffix(f, hs, i) })
}
