package api

import (
	"errors"
	"net/http"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

// Replies are nftlb 1.0's: {"response": "success"} for a change, and for an
// error {"response": "<nftlb's text>. <xlb's message>"} with nftlb's status
// code, so a client that tests nftlb's texts or codes works unchanged while
// the message still names the object, field, value and what is allowed.
// docs/nftlb-compat.md lists the codes.

// nftlb's reply texts.
const (
	textSuccess        = "success"
	textInvalidRequest = "invalid request"                 // unknown path or method
	textStructure      = "the structure is invalid"        // not JSON, or the wrong shape
	textUnknownObject  = "the object to modify is unknown" // an object without a name, a missing farm
	textParsing        = "error parsing buffer"            // a field or value refused
	textRules          = "error generating rules"          // the kernel (or the disk) failed
	textDeleteFarm     = "error deleting farm"
	textDeleteBackend  = "error deleting backend"
	textDeleteAddress  = "error stopping address" // nftlb stops an address before deleting it
	textDeleteFarmAddr = "error deleting farm address"
	textDeleteSession  = "error deleting session"
	textDeletePolicy   = "error stopping policy" // nftlb stops a policy before deleting it
	textDetachPolicy   = "error deleting farm policy"
	textDeleteElement  = "error deleting policy element"
	textNoElements     = "could not get the policy elements" // an element of a missing policy
)

// SessionsDeletedHeader carries how many sessions a DELETE of sessions
// removed: the body is nftlb's {"response": "success"}, which has no room
// for it.
const SessionsDeletedHeader = "X-Xlb-Sessions-Deleted"

// replyError gives an error the nftlb text of the operation that failed
// (text), and a status when the error's kind does not decide it.
type replyError struct {
	text   string
	status int // 0: from the error's kind
	err    error
}

func (e *replyError) Error() string { return e.err.Error() }
func (e *replyError) Unwrap() error { return e.err }

// failed labels err, if any, with the nftlb text of the operation.
func failed(text string, err error) error {
	if err == nil {
		return nil
	}
	var re *replyError
	if errors.As(err, &re) {
		return err
	}
	return &replyError{text: text, err: err}
}

// reply returns the status and the response text of an error.
func reply(err error) (int, string) {
	var (
		re  *replyError
		he  *httpError
		mbe *http.MaxBytesError
		se  *model.StructureError
		mne *model.MissingNameError
		fe  *model.FieldError
		nf  *engine.NotFoundError
		ce  *engine.ConflictError
		nse *engine.NotSupportedError
		ue  *store.UnavailableError
	)
	text, status := "", 0
	if errors.As(err, &re) {
		text, status = re.text, re.status
	}
	def := func(t string, s int) {
		if text == "" {
			text = t
		}
		if status == 0 {
			status = s
		}
	}
	switch {
	case errors.As(err, &ue):
		// The state is read-only (a full disk) or its directory is gone:
		// nothing changed, and the change may work later.
		def(textRules, http.StatusServiceUnavailable)
	case errors.As(err, &mbe):
		def(textStructure, http.StatusRequestEntityTooLarge)
	case errors.As(err, &se):
		def(textStructure, http.StatusBadRequest)
	case errors.As(err, &mne):
		def(textUnknownObject, http.StatusNotFound)
	case errors.As(err, &he):
		def(textInvalidRequest, he.status)
	case errors.As(err, &nf):
		def(textUnknownObject, http.StatusNotFound)
	case errors.As(err, &ce):
		def(textParsing, http.StatusConflict)
	case errors.As(err, &nse):
		def(textInvalidRequest, http.StatusNotImplemented)
	case errors.As(err, &fe):
		// nftlb answers an unknown key with 500 ("error parsing buffer.
		// Unknown key 'x'"); xlb with 400, as every other bad value: a 5xx
		// makes clients and proxies retry, and alerts count a server fault
		// (docs/nftlb-compat.md).
		def(textParsing, http.StatusBadRequest)
	default:
		def(textRules, http.StatusInternalServerError)
	}
	return status, text + ". " + err.Error()
}

// writeResponse writes nftlb's {"response": "<text>"} (its spacing
// included).
func writeResponse(w http.ResponseWriter, status int, text string) {
	body := append([]byte(`{"response": `), appendJSONText(nil, clipMessage(text))...)
	writeJSON(w, status, append(body, '}'))
}

func writeError(w http.ResponseWriter, status int, msg string) { writeResponse(w, status, msg) }

func writeOK(w http.ResponseWriter) { writeResponse(w, http.StatusOK, textSuccess) }
