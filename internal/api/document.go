package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

// nftlb's configuration document: its config file holds farms, addresses
// and policies at the top level, {"farms": [...], "addresses": [...],
// "policies": [...]}, and its POST and PUT routes take such a document
// whatever the route (its config_buffer reads every top-level key). Each
// route decodes its own kind first; only a body refused for a top-level key
// of another of the three kinds is read as a document (isDocumentKey), so
// the common bodies pay nothing for it.

// documentKinds are the top-level keys of nftlb's configuration document.
var documentKinds = []string{"farms", "addresses", "policies"}

// isDocumentKey reports whether err is a decoder's refusal of a top-level
// key that is one of the document's kinds.
func isDocumentKey(err error) bool {
	var fe *model.FieldError
	if !errors.As(err, &fe) || fe.Object != "" || !strings.HasPrefix(fe.Problem, "unknown top-level field") {
		return false
	}
	for _, k := range documentKinds {
		if fe.Field == k {
			return true
		}
	}
	return false
}

// putDocument applies a configuration document in one transaction:
// policies first (farms name them), then the farms, whose address objects
// that only name an address take its values from the document's addresses
// (or from a farm that has it), then the document's addresses, each set in
// every farm that uses it. An address no farm uses is kept on its own, as
// by POST /addresses.
func (s *Server) putDocument(w http.ResponseWriter, r *http.Request, body []byte) error {
	var parts map[string]json.RawMessage
	if err := json.Unmarshal(body, &parts); err != nil {
		return badRequest(&model.StructureError{Msg: "request body is not a JSON object"})
	}
	for k := range parts {
		if !isKind(k) {
			return badRequest(&model.FieldError{Field: k, Problem: "unknown top-level field; the body is {\"farms\": [...], \"addresses\": [...], \"policies\": [...]} (nftlb's configuration document)", UnknownField: true})
		}
	}
	wrap := func(kind string) []byte {
		return append(append([]byte(`{"`+kind+`":`), parts[kind]...), '}')
	}
	_, err := s.eng.Change(r.Context(), func(tx *engine.Txn) error {
		if parts["policies"] != nil {
			tds, err := model.DecodeTables(wrap("policies"), tx.Table, model.VocabPolicies)
			if err != nil {
				return badRequest(err)
			}
			for _, td := range tds {
				if err := upsertPolicy(tx, td); err != nil {
					return err
				}
			}
		}
		var addrs []model.Address
		if parts["addresses"] != nil {
			var err error
			if addrs, err = model.DecodeAddresses(wrap("addresses"), addressLookup(tx)); err != nil {
				return badRequest(err)
			}
		}
		if parts["farms"] != nil {
			current := addressLookup(tx)
			lookup := func(name string) (model.Address, bool) {
				for _, a := range addrs {
					if a.Name == name {
						return a, true
					}
				}
				return current(name)
			}
			farms, err := model.DecodeFarmsWith(wrap("farms"), tx.Get, lookup)
			if err != nil {
				return badRequest(err)
			}
			for _, f := range farms {
				if old := f.RenamedFrom(); old != "" {
					if err := tx.Delete(old); err != nil {
						return err
					}
				}
				if err := tx.Put(f); err != nil {
					return err
				}
			}
		}
		return setAddresses(tx, addrs)
	})
	if err != nil {
		return err
	}
	writeOK(w)
	return nil
}

func isKind(k string) bool {
	for _, x := range documentKinds {
		if k == x {
			return true
		}
	}
	return false
}

// setAddresses gives every farm that uses one of addrs its values; an
// address no farm uses is kept on its own (engine: unused addresses).
func setAddresses(tx *engine.Txn, addrs []model.Address) error {
	if len(addrs) == 0 {
		return nil
	}
	farms := tx.Farms()
	for _, a := range addrs {
		n := 0
		for _, f := range farms {
			nf := f.Clone()
			if !nf.SetAddress(a) {
				continue
			}
			n++
			if err := nf.Validate(); err != nil {
				return err
			}
			if err := tx.Put(nf); err != nil {
				return err
			}
		}
		if n == 0 {
			if err := tx.PutUnusedAddress(a); err != nil {
				return err
			}
		}
	}
	return nil
}
