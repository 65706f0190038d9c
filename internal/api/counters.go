package api

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
)

// CountersJSON are a farm's or a backend's traffic counters on the wire
// (every value a string, as nftlb's). In is client -> backend, out backend
// -> client; bytes of the IP packets.
type CountersJSON struct {
	Connections string `json:"connections"`
	InPackets   string `json:"in-packets"`
	OutPackets  string `json:"out-packets"`
	InBytes     string `json:"in-bytes"`
	OutBytes    string `json:"out-bytes"`
}

// BackendCountersJSON are one backend's counters.
type BackendCountersJSON struct {
	Name string `json:"name"`
	CountersJSON
}

// FarmCountersJSON is the body of GET /farms/{name}/counters.
type FarmCountersJSON struct {
	Name string `json:"name"`
	CountersJSON
	Backends []BackendCountersJSON `json:"backends"`
}

func countersJSON(c dataplane.Counters) CountersJSON {
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	return CountersJSON{Connections: u(c.Connections), InPackets: u(c.InPackets), OutPackets: u(c.OutPackets),
		InBytes: u(c.InBytes), OutBytes: u(c.OutBytes)}
}

func (s *Server) getCounters(w http.ResponseWriter, r *http.Request) error {
	f, c, err := s.eng.Counters(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	out := FarmCountersJSON{Name: f.Name, CountersJSON: countersJSON(c.Counters), Backends: []BackendCountersJSON{}}
	for _, b := range c.Backends {
		out.Backends = append(out.Backends, BackendCountersJSON{Name: b.Name, CountersJSON: countersJSON(b.Counters)})
	}
	body, err := json.Marshal(out)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, append(body, '\n'))
	return nil
}

func listingCounters(c dataplane.Counters) model.ListingCounters {
	return model.ListingCounters{c.Connections, c.InPackets, c.OutPackets, c.InBytes, c.OutBytes}
}

// writeStatsListing sends the ipvsadm -L --stats style table.
func (s *Server) writeStatsListing(w http.ResponseWriter, r *http.Request, numeric bool) error {
	farms, cs, err := s.eng.AllCounters(r.Context())
	if err != nil {
		return err
	}
	buf := make([]byte, 0, len(model.StatsListingHeader)+len(farms)*256)
	buf = append(buf, model.StatsListingHeader...)
	var bes []model.ListingCounters
	for i, f := range farms {
		bes = bes[:0]
		for _, b := range cs[i].Backends {
			bes = append(bes, listingCounters(b.Counters))
		}
		buf = f.AppendStatsListing(buf, numeric, listingCounters(cs[i].Counters), bes)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(buf)))
	w.Write(buf)
	return nil
}
