package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

// nftlb 1.0's routes beyond farms and backends: deleting everything or
// every backend, flushing sessions, and address objects.

// deleteFarms is DELETE /farms: without a body every farm goes (nftlb
// deletes them all); with one, the objects it lists (deleteListed).
func (s *Server) deleteFarms(w http.ResponseWriter, r *http.Request) error {
	body, err := optionalBody(w, r)
	if err != nil {
		return err
	}
	if len(body) > 0 {
		return s.deleteListed(w, r, body)
	}
	if _, err := s.eng.Change(r.Context(), func(tx *engine.Txn) error {
		tx.ReplaceAll()
		return nil
	}); err != nil {
		return failed(textDeleteFarm, err)
	}
	writeOK(w)
	return nil
}

// optionalBody reads a body that may be empty (DELETE).
func optionalBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.ContentLength == 0 {
		return nil, nil
	}
	body, err := readAll(http.MaxBytesReader(w, r.Body, MaxBulkBody), min(r.ContentLength, MaxBulkBody, maxSizeHint))
	if err != nil {
		return nil, &httpError{status: http.StatusBadRequest, err: fmt.Errorf("read request body: %w", err)}
	}
	return body, nil
}

// deleteListed deletes what a DELETE body lists, as nftlb does:
// {"farms":[{"name":"f","backends":[{"name":"b"}],"addresses":[{"name":"a"}]}]}
// removes those backends and addresses of farm f. A farm item that lists
// nothing to delete is refused (nftlb answers success and does nothing).
func (s *Server) deleteListed(w http.ResponseWriter, r *http.Request, body []byte) error {
	obj, err := jsonObject(body)
	if err != nil {
		return err
	}
	var req struct {
		Farms []struct {
			Name      string                  `json:"name"`
			Backends  []struct{ Name string } `json:"backends"`
			Addresses []struct{ Name string } `json:"addresses"`
		} `json:"farms"`
	}
	if len(obj) != 1 || obj["farms"] == nil || jsonUnmarshal(body, &req) != nil {
		return &model.StructureError{Msg: `a DELETE body is {"farms":[{"name": ..., "backends": [{"name": ...}], "addresses": [{"name": ...}]}]}`}
	}
	_, err = s.eng.Change(r.Context(), func(tx *engine.Txn) error {
		for _, item := range req.Farms {
			f, ok := tx.Get(item.Name)
			if !ok {
				return failed(textDeleteFarm, &engine.NotFoundError{What: fmt.Sprintf("farm %q", item.Name)})
			}
			if len(item.Backends) == 0 && len(item.Addresses) == 0 {
				return &model.FieldError{Object: fmt.Sprintf("farm %q", item.Name), Field: "farms",
					Problem: "a DELETE body names the backends or addresses to delete; to delete the farm, DELETE /farms/" + item.Name}
			}
			nf := f.Clone()
			for _, b := range item.Backends {
				_, i := nf.Backend(b.Name)
				if i < 0 {
					return failed(textDeleteBackend, &engine.NotFoundError{What: fmt.Sprintf("farm %q backend %q", item.Name, b.Name)})
				}
				nf.Backends = slices.Delete(nf.Backends, i, i+1)
			}
			for _, a := range item.Addresses {
				if !nf.RemoveAddress(a.Name) {
					return failed(textDeleteFarmAddr, &engine.NotFoundError{What: fmt.Sprintf("farm %q address %q", item.Name, a.Name)})
				}
			}
			if err := tx.Put(nf); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	writeOK(w)
	return nil
}

// deleteBackends is DELETE /farms/{name}/backends: every backend goes.
func (s *Server) deleteBackends(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	_, err := s.eng.Change(r.Context(), func(tx *engine.Txn) error {
		f, ok := tx.Get(name)
		if !ok {
			return &engine.NotFoundError{What: fmt.Sprintf("farm %q", name)}
		}
		nf := f.Clone()
		nf.Backends = nil
		return tx.Put(nf)
	})
	if err != nil {
		return failed(textDeleteBackend, err)
	}
	writeOK(w)
	return nil
}

// deleteAllSessions is DELETE /farms/{name}/sessions: every session of
// the farm goes; the count is in SessionsDeletedHeader.
func (s *Server) deleteAllSessions(w http.ResponseWriter, r *http.Request) error {
	n, err := s.eng.FlushSessions(r.Context(), r.PathValue("name"))
	if err != nil {
		return failed(textDeleteSession, err)
	}
	w.Header().Set(SessionsDeletedHeader, strconv.Itoa(n))
	writeOK(w)
	return nil
}

// addressList collects the farms' addresses by name (the first farm's
// values win; sharing a name means the same address) with how many farms
// use each, in farm name order, then the addresses no farm uses (used 0).
func addressList(farms []*model.Farm, unused []*model.Address) ([]model.Address, []int) {
	var addrs []model.Address
	var used []int
	index := map[string]int{}
	for _, f := range farms {
		for _, a := range f.AllAddresses() {
			if i, ok := index[a.Name]; ok {
				used[i]++
				continue
			}
			index[a.Name] = len(addrs)
			addrs = append(addrs, a)
			used = append(used, 1)
		}
	}
	for _, a := range unused {
		if _, ok := index[a.Name]; !ok {
			addrs = append(addrs, *a)
			used = append(used, 0)
		}
	}
	return addrs, used
}

// addressLookup finds an address by name as the transaction has it: a
// farm's, or one no farm uses.
func addressLookup(tx *engine.Txn) model.AddressLookup {
	return func(name string) (model.Address, bool) {
		if a, ok := tx.UnusedAddress(name); ok {
			return *a, true
		}
		addrs, _ := addressList(tx.Farms(), nil)
		for _, a := range addrs {
			if a.Name == name {
				return a, true
			}
		}
		return model.Address{}, false
	}
}

func (s *Server) getAddresses(w http.ResponseWriter, r *http.Request) error {
	snap := s.eng.Snapshot()
	addrs, used := addressList(snap.Farms(), snap.UnusedAddresses())
	writeJSON(w, http.StatusOK, model.AppendAddressesJSON(nil, addrs, used))
	return nil
}

// getAddress answers the address of that name, or an empty list (nftlb).
func (s *Server) getAddress(w http.ResponseWriter, r *http.Request) error {
	snap := s.eng.Snapshot()
	addrs, used := addressList(snap.Farms(), snap.UnusedAddresses())
	for i, a := range addrs {
		if a.Name == r.PathValue("address") {
			writeJSON(w, http.StatusOK, model.AppendAddressesJSON(nil, addrs[i:i+1], used[i:i+1]))
			return nil
		}
	}
	writeJSON(w, http.StatusOK, model.AppendAddressesJSON(nil, nil, nil))
	return nil
}

// putAddresses changes addresses in every farm that uses them, in one
// transaction; an address no farm uses is kept on its own until a farm
// names it.
func (s *Server) putAddresses(w http.ResponseWriter, r *http.Request) error {
	body, err := readBody(w, r, MaxBulkBody)
	if err != nil {
		return err
	}
	_, err = s.eng.Change(r.Context(), func(tx *engine.Txn) error {
		addrs, err := model.DecodeAddresses(body, addressLookup(tx))
		if err != nil {
			return err
		}
		return setAddresses(tx, addrs) // document.go
	})
	if isDocumentKey(err) {
		return s.putDocument(w, r, body)
	}
	if err != nil {
		return err
	}
	writeOK(w)
	return nil
}

// deleteAddress removes the address from every farm that uses it (nftlb
// does the same: a farm whose only address goes listens nowhere), or the
// address no farm uses.
func (s *Server) deleteAddress(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("address")
	_, err := s.eng.Change(r.Context(), func(tx *engine.Txn) error {
		if tx.DeleteUnusedAddress(name) {
			return nil
		}
		n := 0
		for _, f := range tx.Farms() {
			nf := f.Clone()
			if !nf.RemoveAddress(name) {
				continue
			}
			n++
			if err := tx.Put(nf); err != nil {
				return err
			}
		}
		if n == 0 {
			return &engine.NotFoundError{What: fmt.Sprintf("address %q", name)}
		}
		return nil
	})
	if err != nil {
		return failed(textDeleteAddress, err)
	}
	writeOK(w)
	return nil
}

// deleteFarmAddress is DELETE /farms/{name}/addresses/{address}.
func (s *Server) deleteFarmAddress(w http.ResponseWriter, r *http.Request) error {
	name, addr := r.PathValue("name"), r.PathValue("address")
	_, err := s.eng.Change(r.Context(), func(tx *engine.Txn) error {
		f, ok := tx.Get(name)
		if !ok {
			return &engine.NotFoundError{What: fmt.Sprintf("farm %q", name)}
		}
		nf := f.Clone()
		if !nf.RemoveAddress(addr) {
			return &engine.NotFoundError{What: fmt.Sprintf("farm %q address %q", name, addr)}
		}
		return tx.Put(nf)
	})
	if err != nil {
		return failed(textDeleteFarmAddr, err)
	}
	writeOK(w)
	return nil
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
