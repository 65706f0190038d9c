package model

// SetField parses value as the farm field named field (nftlb's wire name,
// e.g. "mode", "persistence", "est-connlimit") and sets it on f, without
// validating the farm as a whole. Other sources of farms (Kubernetes
// annotations) use it so their allowed values and error texts are the
// model's. The error says what is allowed.
func (f *Farm) SetField(field, value string) error {
	for i := range farmFields {
		fld := &farmFields[i]
		if fld.name == field && fld.decode != nil {
			return fld.decode(f, value)
		}
	}
	return &FieldError{Field: field, Problem: "unknown field; known fields are " + fieldNames(farmFields)}
}
