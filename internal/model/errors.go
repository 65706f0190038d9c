package model

// Errors of decoding that are not about one field's value: nftlb answers
// them with texts and status codes of their own (internal/api).

// StructureError says a body is not the JSON structure expected (not JSON,
// or an object where an array belongs): nftlb's "the structure is
// invalid".
type StructureError struct{ Msg string }

func (e *StructureError) Error() string { return e.Msg }

// MissingNameError says an object of a body has no (valid) name, so the
// object to change is unknown: nftlb's "the object to modify is unknown".
type MissingNameError struct{ What string }

func (e *MissingNameError) Error() string {
	return e.What + ": field \"name\" is required and must be " + nameRule
}
