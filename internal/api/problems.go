package api

import (
	"encoding/json"
	"net/http"

	"github.com/xlb-lb/xlb/internal/engine"
)

// problemJSON is one problem of the saved state as GET /state/problems
// lists it (nftlb's style: every value a string).
type problemJSON struct {
	Farm    string `json:"farm"`
	Loaded  string `json:"loaded"` // "yes": served as saved; "no": set aside
	Problem string `json:"problem"`
	File    string `json:"file,omitempty"`
}

// getProblems lists the saved farms start-up loaded with a problem or set
// aside (engine.Problem), until a change fixes them.
func (s *Server) getProblems(w http.ResponseWriter, r *http.Request) error {
	ps := s.eng.Problems()
	out := struct {
		Problems []problemJSON `json:"problems"`
	}{Problems: make([]problemJSON, 0, len(ps))}
	for _, p := range ps {
		out.Problems = append(out.Problems, toProblemJSON(p))
	}
	body, err := json.Marshal(out)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, append(body, '\n'))
	return nil
}

func toProblemJSON(p engine.Problem) problemJSON {
	loaded := "no"
	if p.Loaded {
		loaded = "yes"
	}
	return problemJSON{Farm: p.Farm, Loaded: loaded, Problem: p.Problem, File: p.File}
}
