package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

// nftlb's policies API. A policy is an addr table with a verdict: these
// routes read and write the same tables as /tables, in nftlb's words
// ("type": "blacklist"/"whitelist", "elements": [{"data", "time"}]).

var policyRoutes = []Route{
	{Method: http.MethodGet, Path: "/policies", handle: (*Server).getPolicies},
	{Method: http.MethodPost, Path: "/policies", Write: true, handle: (*Server).putPolicies},
	{Method: http.MethodPut, Path: "/policies", Write: true, handle: (*Server).putPolicies},
	{Method: http.MethodDelete, Path: "/policies", Write: true, handle: (*Server).deletePolicies},
	{Method: http.MethodGet, Path: "/policies/{name}", handle: (*Server).getPolicy},
	{Method: http.MethodPut, Path: "/policies/{name}", Write: true, handle: (*Server).putPolicy},
	{Method: http.MethodDelete, Path: "/policies/{name}", Write: true, handle: (*Server).deletePolicy},
	{Method: http.MethodGet, Path: "/policies/{name}/elements", handle: (*Server).getElements},
	{Method: http.MethodPost, Path: "/policies/{name}/elements", Write: true, handle: (*Server).postElements},
	{Method: http.MethodPut, Path: "/policies/{name}/elements", Write: true, handle: (*Server).postElements},
	{Method: http.MethodDelete, Path: "/policies/{name}/elements/{data...}", Write: true, handle: (*Server).deleteElement},
	{Method: http.MethodPost, Path: "/farms/{name}/policies", Write: true, handle: (*Server).attachPolicies},
	{Method: http.MethodPut, Path: "/farms/{name}/policies", Write: true, handle: (*Server).attachPolicies},
	{Method: http.MethodDelete, Path: "/farms/{name}/policies/{policy}", Write: true, handle: (*Server).detachPolicy},
}

func (s *Server) writePolicies(w http.ResponseWriter, st *engine.State, tables []*model.Table) {
	used := func(t *model.Table) int { return len(st.TableUsers(t.Name)) }
	buf := append([]byte{'{'}, model.AppendTablesJSON(nil, tables, model.VocabPolicies, true, used, time.Now().Unix())...)
	writeJSON(w, http.StatusOK, append(buf, "}\n"...))
}

func (s *Server) getPolicies(w http.ResponseWriter, r *http.Request) error {
	st := s.eng.Snapshot()
	var ps []*model.Table
	for _, t := range st.Tables() {
		if t.IsPolicy() {
			ps = append(ps, t)
		}
	}
	s.writePolicies(w, st, ps)
	return nil
}

func (s *Server) policyNamed(st *engine.State, name string) (*model.Table, error) {
	t, ok := st.Table(name)
	if !ok || !t.IsPolicy() {
		return nil, &engine.NotFoundError{What: fmt.Sprintf("policy %q", name)}
	}
	return t, nil
}

// getPolicy answers one policy; a missing one answers an empty list, as
// nftlb does (200 {"policies": []}).
func (s *Server) getPolicy(w http.ResponseWriter, r *http.Request) error {
	st := s.eng.Snapshot()
	t, err := s.policyNamed(st, r.PathValue("name"))
	if err != nil {
		s.writePolicies(w, st, nil)
		return nil
	}
	s.writePolicies(w, st, []*model.Table{t})
	return nil
}

// deletePolicies deletes every policy, in one change; with a body
// ({"policies": [{"name": ...}, ...]}, as kube-nftlb sends for a
// NetworkPolicy's lists) only the policies it names, those that exist (a
// NetworkPolicy without egress rules has no output lists). A policy a farm
// uses refuses it all (nftlb detaches it from the farm; xlb does not detach
// behind a farm's back: docs/nftlb-compat.md).
func (s *Server) deletePolicies(w http.ResponseWriter, r *http.Request) error {
	body, err := optionalBody(w, r)
	if err != nil {
		return err
	}
	var named map[string]bool
	if len(bytes.TrimSpace(body)) > 0 {
		var req struct {
			Policies []struct {
				Name string `json:"name"`
			} `json:"policies"`
		}
		if err := json.Unmarshal(body, &req); err != nil || req.Policies == nil {
			return failed(textDeletePolicy, badRequest(&model.StructureError{Msg: `a DELETE /policies body is {"policies":[{"name": ...}, ...]}: the policies to delete`}))
		}
		named = map[string]bool{}
		for _, p := range req.Policies {
			named[p.Name] = true
		}
	}
	_, err = s.eng.Change(r.Context(), func(tx *engine.Txn) error {
		for _, t := range tx.Tables() {
			if !t.IsPolicy() || named != nil && !named[t.Name] {
				continue
			}
			if err := tx.DestroyTable(t.Name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return failed(textDeletePolicy, err)
	}
	writeOK(w)
	return nil
}

// putPolicy creates or changes the policy named in the path.
func (s *Server) putPolicy(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(w, r, MaxTableBody)
	if err != nil {
		return err
	}
	name := r.PathValue("name")
	_, err = s.eng.Change(r.Context(), func(tx *engine.Txn) error {
		td, err := model.DecodeTable(body, name, tx.Table, model.VocabPolicies)
		if err != nil {
			return badRequest(err)
		}
		return upsertPolicy(tx, td)
	})
	if err != nil {
		return err
	}
	writeOK(w)
	return nil
}

// putPolicies creates or changes policies, as nftlb's POST and PUT do:
// fields given replace the policy's, elements given are added to it (an
// element that exists keeps it, with the time given).
func (s *Server) putPolicies(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(w, r, MaxTableBody)
	if err != nil {
		return err
	}
	_, err = s.eng.Change(r.Context(), func(tx *engine.Txn) error {
		tds, err := model.DecodeTables(body, tx.Table, model.VocabPolicies)
		if err != nil {
			return badRequest(err)
		}
		for _, td := range tds {
			if err := upsertPolicy(tx, td); err != nil {
				return err
			}
		}
		return nil
	})
	if isDocumentKey(err) {
		return s.putDocument(w, r, body) // document.go
	}
	if err != nil {
		return err
	}
	writeOK(w)
	return nil
}

func upsertPolicy(tx *engine.Txn, td model.TableDecl) error {
	if td.Table.Type != model.TableAddr {
		// nftlb's policies hold addresses; tables of the other types
		// get their verdict through /tables.
		return badRequest(&model.FieldError{Object: fmt.Sprintf("policy %q", td.Table.Name), Field: "type", Value: td.Table.TypeString(),
			Problem: fmt.Sprintf("nftlb's policies are addr tables; give a %s table a verdict with PUT /tables/%s (or xlb table %s modify verdict deny)", td.Table.TypeString(), td.Table.Name, td.Table.Name)})
	}
	if err := tx.PutTable(td.Table); err != nil {
		return err
	}
	if len(td.Entries) == 0 {
		return nil
	}
	_, err := tx.AddEntries(td.Table.Name, td.Entries, engine.EntryOptions{Atomic: true, Update: true})
	return err
}

func (s *Server) deletePolicy(w http.ResponseWriter, r *http.Request) error {
	if _, err := s.policyNamed(s.eng.Snapshot(), r.PathValue("name")); err != nil {
		return failed(textDeletePolicy, err)
	}
	return failed(textDeletePolicy, s.deleteTable(w, r))
}

func (s *Server) deleteElement(w http.ResponseWriter, r *http.Request) error {
	if _, err := s.policyNamed(s.eng.Snapshot(), r.PathValue("name")); err != nil {
		return failed(textNoElements, err)
	}
	return failed(textDeleteElement, s.deleteKey(w, r, r.PathValue("data")))
}

func (s *Server) getElements(w http.ResponseWriter, r *http.Request) error {
	t, err := s.policyNamed(s.eng.Snapshot(), r.PathValue("name"))
	if err != nil {
		return err
	}
	now := time.Now().Unix()
	buf := []byte(`{"elements":[`)
	first := true
	t.Entries("", func(e model.TableEntry) bool {
		if !first {
			buf = append(buf, ',')
		}
		first = false
		buf = t.AppendEntryJSON(buf, e, model.VocabPolicies, now)
		return true
	})
	writeJSON(w, http.StatusOK, append(buf, "]}\n"...))
	return nil
}

// postElements adds elements to a policy: {"elements": [{"data": ...}]},
// or text lines. Elements that exist are updated, as in nftlb.
func (s *Server) postElements(w http.ResponseWriter, r *http.Request) error {
	if _, err := s.policyNamed(s.eng.Snapshot(), r.PathValue("name")); err != nil {
		return err
	}
	return s.entryBatch(w, r, model.VocabPolicies, func(tx *engine.Txn, name string, ins []model.EntryInput, o engine.EntryOptions) ([]engine.EntryResult, error) {
		o.Update = true
		return tx.AddEntries(name, ins, o)
	})
}

// attachPolicies attaches policies to a farm: {"policies": [{"name": ...}]}.
func (s *Server) attachPolicies(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(w, r, MaxBody)
	if err != nil {
		return err
	}
	name := r.PathValue("name")
	_, err = s.eng.Change(r.Context(), func(tx *engine.Txn) error {
		f, ok := tx.Get(name)
		if !ok {
			return &engine.NotFoundError{What: fmt.Sprintf("farm %q", name)}
		}
		ps, err := policiesMember(body)
		if err != nil {
			return err
		}
		// Decoded as a patch of the farm, so the policies are checked
		// and added exactly as in POST /farms.
		wrapped := fmt.Appendf(nil, `{"farms":[{"name":%s,"policies":%s}]}`, strconv.Quote(name), ps)
		fs, err := model.DecodeFarms(wrapped, func(string) (*model.Farm, bool) { return f, true })
		if err != nil {
			return badRequest(err)
		}
		return tx.Put(fs[0])
	})
	if err != nil {
		return err
	}
	writeOK(w)
	return nil
}

// policiesMember returns the "policies" member of a body, the array
// itself.
func policiesMember(body []byte) ([]byte, error) {
	obj, err := jsonObject(body)
	if err != nil {
		return nil, err
	}
	for k := range obj {
		if k != "policies" {
			return nil, &httpError{status: http.StatusBadRequest, err: fmt.Errorf("unknown field %q; the body is {\"policies\": [{\"name\": ...}]}", k)}
		}
	}
	ps, ok := obj["policies"]
	if !ok {
		return nil, &httpError{status: http.StatusBadRequest, err: fmt.Errorf("the body is {\"policies\": [{\"name\": ...}]}")}
	}
	return ps, nil
}

func (s *Server) detachPolicy(w http.ResponseWriter, r *http.Request) error {
	name, policy := r.PathValue("name"), r.PathValue("policy")
	_, err := s.eng.Change(r.Context(), func(tx *engine.Txn) error {
		f, ok := tx.Get(name)
		if !ok {
			return &engine.NotFoundError{What: fmt.Sprintf("farm %q", name)}
		}
		nf := f.Clone()
		i := -1
		for j, p := range nf.Policies {
			if p.Name == policy {
				i = j
			}
		}
		if i < 0 {
			return &engine.NotFoundError{What: fmt.Sprintf("farm %q policy %q", name, policy)}
		}
		nf.Policies = append(nf.Policies[:i], nf.Policies[i+1:]...)
		return tx.Put(nf)
	})
	if err != nil {
		return failed(textDetachPolicy, err)
	}
	writeOK(w)
	return nil
}
