// Command gen writes deploy/crd/crds.yaml from api/openapi.yaml (go generate
// ./internal/kube/crd).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/xlb-lb/xlb/internal/kube/crd"
)

func main() {
	in := flag.String("openapi", "../../../api/openapi.yaml", "the REST API's OpenAPI document")
	out := flag.String("o", "../../../deploy/crd/crds.yaml", "where the CRDs go")
	flag.Parse()
	doc, err := os.ReadFile(*in)
	if err == nil {
		var b []byte
		if b, err = crd.Manifests(doc); err == nil {
			err = os.WriteFile(*out, b, 0o644)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gen: %v\n", err)
		os.Exit(1)
	}
}
