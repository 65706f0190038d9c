package api_test

import (
	"encoding/json"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/xlb-lb/xlb/internal/api"
	"github.com/xlb-lb/xlb/internal/model"
)

const openAPIPath = "../../api/openapi.yaml"

type openAPIDoc struct {
	Paths      map[string]map[string]any `yaml:"paths"`
	Components struct {
		SecuritySchemes map[string]struct {
			Type string `yaml:"type"`
			In   string `yaml:"in"`
			Name string `yaml:"name"`
		} `yaml:"securitySchemes"`
		Schemas map[string]struct {
			Properties map[string]map[string]any `yaml:"properties"`
		} `yaml:"schemas"`
	} `yaml:"components"`
}

func loadOpenAPI(t *testing.T) (openAPIDoc, any) {
	t.Helper()
	raw, err := os.ReadFile(openAPIPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPIDoc
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("parse %s: %v", openAPIPath, err)
	}
	var tree any
	if err := yaml.Unmarshal(raw, &tree); err != nil {
		t.Fatal(err)
	}
	return doc, tree
}

// The document describes exactly the routes the handler serves.
func TestOpenAPIRoutes(t *testing.T) {
	doc, _ := loadOpenAPI(t)
	methods := map[string]bool{"get": true, "put": true, "post": true, "delete": true, "patch": true, "head": true, "options": true}
	var documented, served []string
	for path, item := range doc.Paths {
		for m := range item {
			if methods[m] {
				documented = append(documented, strings.ToUpper(m)+" "+path)
			}
		}
	}
	for _, r := range api.Routes() {
		// OpenAPI has no wildcard for the rest of a path: {key...} is
		// documented as {key}.
		served = append(served, r.Method+" "+strings.ReplaceAll(r.Path, "...}", "}"))
	}
	sort.Strings(documented)
	sort.Strings(served)
	if !slices.Equal(documented, served) {
		t.Fatalf("api/openapi.yaml documents\n  %s\nthe handler serves\n  %s", strings.Join(documented, "\n  "), strings.Join(served, "\n  "))
	}
	key, ok := doc.Components.SecuritySchemes["key"]
	if !ok || key.Type != "apiKey" || key.In != "header" || key.Name != api.KeyHeader {
		t.Fatalf("security scheme: %+v", key)
	}
}

// Every farm and backend property documented is one the codec knows, and
// the other way round.
func TestOpenAPISchemasMatchCodec(t *testing.T) {
	doc, _ := loadOpenAPI(t)
	fs, err := model.DecodeFarms([]byte(`{"name":"f","virtual-addr":"10.0.0.1","persistence":"srcip","source-table":"t","check":{"type":"tcp","port":"80"},
		"backends":[{"name":"b","ip-addr":"10.0.0.2","check":{"fall":"2"}}],
		"sessions":[{"client":"10.9.0.1","backend":"b"}]}`),
		func(string) (*model.Farm, bool) { return nil, false })
	if err != nil {
		t.Fatal(err)
	}
	var farm map[string]json.RawMessage
	if err := json.Unmarshal(fs[0].AppendJSON(nil), &farm); err != nil {
		t.Fatal(err)
	}
	var backends []map[string]json.RawMessage
	if err := json.Unmarshal(farm["backends"], &backends); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		schema string
		codec  map[string]json.RawMessage
	}{{"Farm", farm}, {"Backend", backends[0]}} {
		props := doc.Components.Schemas[c.schema].Properties
		for k, p := range props {
			if wo, _ := p["writeOnly"].(bool); wo {
				continue // accepted in requests, never printed (newname)
			}
			if ro, _ := p["readOnly"].(bool); ro {
				continue // added by GET /farms/{name}, not the codec
			}
			if _, ok := c.codec[k]; !ok {
				t.Errorf("schema %s documents %q, which the codec does not emit", c.schema, k)
			}
		}
		for k := range c.codec {
			if _, ok := props[k]; !ok {
				t.Errorf("the codec emits %s field %q, which schema %s does not document", c.schema, k, c.schema)
			}
		}
	}
}

// Every $ref points at something in the document.
func TestOpenAPIRefsResolve(t *testing.T) {
	_, tree := loadOpenAPI(t)
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if k == "$ref" {
					ref, _ := x.(string)
					if !resolves(tree, ref) {
						t.Errorf("unresolved $ref %q", ref)
					}
					continue
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(tree)
}

func resolves(tree any, ref string) bool {
	path, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return false
	}
	cur := tree
	for _, part := range strings.Split(path, "/") {
		m, ok := cur.(map[string]any)
		if !ok {
			return false
		}
		if cur, ok = m[part]; !ok {
			return false
		}
	}
	return true
}

// Every farm and backend property's JSON types in the document are the
// ones the codec takes (string, and integer or boolean where it reads
// numbers or on/off): a schema saying "string" for a field that takes 80
// too, or "integer" for text, is drift. policies may be null, backends
// may not.
func TestOpenAPITypesMatchCodec(t *testing.T) {
	doc, _ := loadOpenAPI(t)
	for _, c := range []struct{ schema, object string }{{"Farm", "farm"}, {"Backend", "backend"}} {
		props := doc.Components.Schemas[c.schema].Properties
		for field, want := range model.FieldTypes(c.object) {
			got := schemaTypes(map[string]any(props[field]))
			if field == "name" {
				got = []string{"string"} // $ref Name
			}
			sort.Strings(got)
			sort.Strings(want)
			if !slices.Equal(got, want) {
				t.Errorf("schema %s property %q takes %v; the codec takes %v", c.schema, field, got, want)
			}
		}
	}
	props := doc.Components.Schemas["Farm"].Properties
	if p := props["policies"]; p["nullable"] != true {
		t.Errorf(`schema Farm: "policies" is not nullable, but the codec takes "policies": null`)
	}
	if p := props["backends"]; p["nullable"] == true {
		t.Errorf(`schema Farm: "backends" is nullable, but the codec refuses "backends": null`)
	}
	for _, body := range []string{
		`{"name":"f","virtual-addr":"10.0.0.1","policies":null}`,
	} {
		if _, err := model.DecodeFarms([]byte(body), func(string) (*model.Farm, bool) { return nil, false }); err != nil {
			t.Errorf("%s: %v", body, err)
		}
	}
	if _, err := model.DecodeFarms([]byte(`{"name":"f","virtual-addr":"10.0.0.1","backends":null}`), func(string) (*model.Farm, bool) { return nil, false }); err == nil {
		t.Errorf(`"backends": null accepted`)
	}
}

// schemaTypes lists the types a property schema allows: its type, or
// those of its oneOf.
func schemaTypes(p any) []string {
	m, _ := p.(map[string]any)
	if t, ok := m["type"].(string); ok {
		return []string{t}
	}
	var out []string
	alts, _ := m["oneOf"].([]any)
	for _, a := range alts {
		out = append(out, schemaTypes(a)...)
	}
	return out
}
