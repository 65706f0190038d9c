package api

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// reconcileJSON is POST /reconcile's reply: nftlb's {"response":
// "success"} and the engine's drift counters (every value a string, as
// nftlb writes numbers).
type reconcileJSON struct {
	Response   string `json:"response"`
	Farms      string `json:"farms"`
	Watching   string `json:"drift-watch"`
	Seen       string `json:"drift-seen"`
	Repairs    string `json:"drift-repairs"`
	Failed     string `json:"drift-repairs-failed"`
	Reconciles string `json:"reconciles"`
}

// postReconcile makes the kernel hold the state again, whatever others
// changed in it (engine.Reconcile): what SIGHUP and `xlb reconcile` do.
func (s *Server) postReconcile(w http.ResponseWriter, r *http.Request) error {
	n, err := s.eng.Reconcile(r.Context())
	if err != nil {
		return failed(textRules, err)
	}
	st := s.eng.DriftStats()
	watching := "no"
	if st.Watching {
		watching = "yes"
	}
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	body, err := json.Marshal(reconcileJSON{Response: textSuccess, Farms: strconv.Itoa(n), Watching: watching,
		Seen: u(st.Seen), Repairs: u(st.Repairs), Failed: u(st.Failed), Reconciles: u(st.Reconciles)})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, append(body, '\n'))
	return nil
}
