package client

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// The server marshals this package's types (internal/api aliases them), and
// internal/api/openapi.json documents them for every other client: the
// TypeScript and Python SDKs check their own copies against that document
// too (sdk/typescript/test/wire.test.ts, sdk/python/tests/test_wire.py). The
// tests here keep this package and the document equal.

// openAPIFile is the document, from this package's directory (go test runs
// in it).
const openAPIFile = "../internal/api/openapi.json"

// mirrors pairs each schema in openapi.json's components with the type of
// this package that is its copy. Every struct type types.go declares must
// be here (TestOpenAPIMirrorsEveryType). Schemas left out are not mirrored
// by a named type: the list envelopes ({"sandboxes": [...]}, read into an
// anonymous struct by each method), Removed and Revoked (answers
// the client does not read), Env (a json.RawMessage here) and ExecStarted
// (the client does not read the pid).
var mirrors = map[string]any{
	"Sandbox":            Sandbox{},
	"Origin":             Origin{},
	"Whoami":             Whoami{},
	"Version":            Version{},
	"Node":               Node{},
	"CreateRequest":      CreateRequest{},
	"ExecRequest":        ExecRequest{},
	"ExecEvent":          ExecEvent{},
	"ExecStarted":        ExecStarted{},
	"ExecExit":           ExecExit{},
	"ExecResize":         ExecResize{},
	"ExecSignal":         ExecSignal{},
	"Image":              Image{},
	"PullRequest":        PullRequest{},
	"PullEvent":          PullEvent{},
	"Capabilities":       Capabilities{},
	"Error":              Error{},
	"ForkRequest":        ForkRequest{},
	"ForkResponse":       ForkResponse{},
	"Checkpoint":         Checkpoint{},
	"SandboxRemoved":     SandboxRemoved{},
	"CheckpointRequest":  CheckpointRequest{},
	"RestoreRequest":     RestoreRequest{},
	"Snapshot":           Snapshot{},
	"SnapshotRequest":    SnapshotRequest{},
	"Session":            Session{},
	"Event":              Event{},
	"EventPage":          EventPage{},
	"ResumeRequest":      ResumeRequest{},
	"ResumeResponse":     ResumeResponse{},
	"ReappliedChange":    ReappliedChange{},
	"ReplayedExec":       ReplayedExec{},
	"Environment":        Environment{},
	"EnvironmentRequest": EnvironmentRequest{},
	"DiskUsage":          DiskUsage{},
	"DiskUsageItem":      DiskUsageItem{},
	"StoreSpace":         StoreSpace{},
	"HostSpace":          HostSpace{},
	"ProjectQuota":       ProjectQuota{},
	"ProjectUse":         ProjectUse{},
	"Token":              Token{},
	"TokenRequest":       TokenRequest{},
	"TokenCreated":       TokenCreated{},
	"Project":            Project{},
	"Secret":             Secret{},
	"SecretRequest":      SecretRequest{},
	"Grant":              Grant{},
	"Policy":             Policy{},
}

// schemaOf is the schema each mirrored type is the copy of.
var schemaOf = func() map[reflect.Type]string {
	m := map[reflect.Type]string{}
	for name, v := range mirrors {
		m[reflect.TypeOf(v)] = name
	}
	return m
}()

type openAPIDoc struct {
	Paths      map[string]map[string]json.RawMessage `json:"paths,omitempty"`
	Components struct {
		Schemas    map[string]*schema         `json:"schemas,omitempty"`
		Responses  map[string]json.RawMessage `json:"responses,omitempty"`
		Parameters map[string]json.RawMessage `json:"parameters,omitempty"`
	} `json:"components,omitempty"`
}

// schema is the part of an OpenAPI schema object the comparison reads.
type schema struct {
	Ref        string             `json:"$ref,omitempty"`
	Type       string             `json:"type,omitempty"`
	Format     string             `json:"format,omitempty"`
	Properties map[string]*schema `json:"properties,omitempty"`
	Required   []string           `json:"required,omitempty"`
	Items      *schema            `json:"items,omitempty"`
	AllOf      []*schema          `json:"allOf,omitempty"`
	OneOf      []*schema          `json:"oneOf,omitempty"`
}

func loadOpenAPI(t *testing.T) *openAPIDoc {
	t.Helper()
	b, err := os.ReadFile(openAPIFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPIDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%s: %v", openAPIFile, err)
	}
	return &doc
}

// TestOpenAPIMirrorsEveryType checks that every struct type types.go
// declares is paired with a schema in mirrors, so none escapes the check
// below, and that every schema it names exists.
func TestOpenAPIMirrorsEveryType(t *testing.T) {
	doc := loadOpenAPI(t)
	f, err := parser.ParseFile(token.NewFileSet(), "types.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	paired := map[string]bool{}
	for typ := range schemaOf {
		paired[typ.Name()] = true
	}
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok {
			continue
		}
		for _, spec := range gd.Specs {
			ts, ok := spec.(*ast.TypeSpec)
			if !ok {
				continue
			}
			if _, isStruct := ts.Type.(*ast.StructType); isStruct && !paired[ts.Name.Name] {
				t.Errorf("types.go declares %s, which mirrors names no schema of openapi.json: pair it with its schema", ts.Name.Name)
			}
		}
	}
	for name := range mirrors {
		if doc.Components.Schemas[name] == nil {
			t.Errorf("mirrors names the schema %s, which openapi.json does not have", name)
		}
	}
}

// TestOpenAPISchemasMatchClientTypes checks each mirrored type against its
// schema: the same JSON names, each of the schema's JSON type (and a $ref
// to the schema of the Go field's type), and required exactly when the
// field is always marshalled (no omitempty or omitzero). For a schema only
// ever sent to the server (a request body), required fields must be always
// marshalled, and the server may take more as optional.
func TestOpenAPISchemasMatchClientTypes(t *testing.T) {
	doc := loadOpenAPI(t)
	requestOnly := requestOnlySchemas(t, doc)
	names := make([]string, 0, len(mirrors))
	for name := range mirrors {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		s := doc.Components.Schemas[name]
		if s == nil {
			continue // TestOpenAPIMirrorsEveryType says so
		}
		typ := reflect.TypeOf(mirrors[name])
		fields := jsonFields(typ)
		required := map[string]bool{}
		for _, r := range s.Required {
			required[r] = true
			if s.Properties[r] == nil {
				t.Errorf("schema %s requires %q, which is not one of its properties", name, r)
			}
		}
		for _, prop := range sortedKeys(s.Properties) {
			f, ok := fields[prop]
			if !ok {
				t.Errorf("schema %s: property %q is not a field of client.%s", name, prop, typ.Name())
				continue
			}
			at := "schema " + name + ": " + prop
			checkType(t, doc, at, f.typ, s.Properties[prop])
			switch {
			case required[prop] && f.omitted:
				t.Errorf("%s is required, but client.%s leaves it out when empty (omitempty/omitzero)", at, typ.Name())
			case !required[prop] && !f.omitted && !requestOnly[name]:
				t.Errorf("%s is not required, but client.%s always sends it (no omitempty/omitzero): require it in openapi.json, or omit it when empty", at, typ.Name())
			}
		}
		for _, field := range sortedKeys(fields) {
			if s.Properties[field] == nil {
				t.Errorf("schema %s: client.%s has the field %q, which the schema does not", name, typ.Name(), field)
			}
		}
	}
}

type jsonField struct {
	typ     reflect.Type
	omitted bool // omitempty or omitzero: left out when empty
}

// jsonFields maps a struct's JSON names to its fields, embedded structs'
// included.
func jsonFields(typ reflect.Type) map[string]jsonField {
	out := map[string]jsonField{}
	for f := range typ.Fields() {
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			for k, v := range jsonFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		o := strings.Split(opts, ",")
		out[name] = jsonField{typ: f.Type, omitted: slices.Contains(o, "omitempty") || slices.Contains(o, "omitzero")}
	}
	return out
}

var (
	timeType = reflect.TypeOf(time.Time{})
	rawType  = reflect.TypeOf(json.RawMessage{})
)

// checkType reports a Go type that is not of the schema's JSON type.
func checkType(t *testing.T, doc *openAPIDoc, at string, typ reflect.Type, s *schema) {
	t.Helper()
	if typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if typ == rawType {
		return // any JSON: the server reads it (a size as "512MiB" or bytes, env as a list or an object)
	}
	s, ref := resolve(doc, s)
	want := jsonType(typ)
	got := schemaTypes(doc, s)
	if !slices.Contains(got, want) {
		t.Errorf("%s is %v in openapi.json; the Go field is %s (%s)", at, got, typ, want)
		return
	}
	switch {
	case typ == timeType && s.Format != "date-time":
		t.Errorf("%s is a time.Time in Go, but not a date-time in openapi.json", at)
	case typ.Kind() == reflect.Slice && typ.Elem().Kind() == reflect.Uint8 && s.Format != "byte":
		t.Errorf("%s is []byte (base64) in Go, but not format byte in openapi.json", at)
	}
	switch want {
	case "object":
		if ref != "" && typ.Kind() == reflect.Struct {
			if mine, ok := schemaOf[typ]; !ok || mine != ref {
				t.Errorf("%s is a %s in openapi.json; the Go field is %s, the copy of %q", at, ref, typ, mine)
			}
		}
	case "array":
		if typ.Kind() == reflect.Slice && s.Items != nil {
			checkType(t, doc, at+"[]", typ.Elem(), s.Items)
		}
	}
}

// jsonType is the JSON type encoding/json writes a Go type as.
func jsonType(typ reflect.Type) string {
	switch {
	case typ == timeType:
		return "string"
	case typ.Kind() == reflect.Slice && typ.Elem().Kind() == reflect.Uint8:
		return "string" // base64
	}
	switch typ.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.Struct, reflect.Map:
		return "object"
	}
	return typ.Kind().String()
}

// resolve follows a $ref (or an allOf of one, OpenAPI 3.0's way to
// describe a $ref) to the schema, and says which component it named.
func resolve(doc *openAPIDoc, s *schema) (*schema, string) {
	ref := ""
	for {
		switch {
		case s.Ref != "":
			ref = strings.TrimPrefix(s.Ref, "#/components/schemas/")
			s = doc.Components.Schemas[ref]
			if s == nil {
				return &schema{}, ref
			}
		case len(s.AllOf) == 1:
			s = s.AllOf[0]
		default:
			return s, ref
		}
	}
}

// schemaTypes lists the JSON types a schema allows; "number" allows
// integers too.
func schemaTypes(doc *openAPIDoc, s *schema) []string {
	var out []string
	for _, o := range s.OneOf {
		r, _ := resolve(doc, o)
		out = append(out, schemaTypes(doc, r)...)
	}
	switch {
	case s.Type != "":
		out = append(out, s.Type)
	case s.Properties != nil:
		out = append(out, "object")
	}
	if slices.Contains(out, "number") {
		out = append(out, "integer")
	}
	return out
}

// requestOnlySchemas names the schemas reached from requests (request
// bodies, parameters) and never from an answer.
func requestOnlySchemas(t *testing.T, doc *openAPIDoc) map[string]bool {
	t.Helper()
	req, resp := map[string]bool{}, map[string]bool{}
	for _, item := range doc.Paths {
		for method, raw := range item {
			if method == "parameters" || strings.HasPrefix(method, "x-") {
				collectRefs(t, doc, raw, req)
				continue
			}
			var op struct {
				RequestBody json.RawMessage `json:"requestBody,omitempty"`
				Parameters  json.RawMessage `json:"parameters,omitempty"`
				Responses   json.RawMessage `json:"responses,omitempty"`
			}
			if err := json.Unmarshal(raw, &op); err != nil {
				continue // summary, description
			}
			collectRefs(t, doc, op.RequestBody, req)
			collectRefs(t, doc, op.Parameters, req)
			collectRefs(t, doc, op.Responses, resp)
		}
	}
	out := map[string]bool{}
	for name := range req {
		if !resp[name] {
			out[name] = true
		}
	}
	if len(out) == 0 {
		t.Fatal("openapi.json: no schema is reached from a request body alone")
	}
	return out
}

// collectRefs adds the name of every schema raw reaches, through $refs to
// components, to into.
func collectRefs(t *testing.T, doc *openAPIDoc, raw json.RawMessage, into map[string]bool) {
	if len(raw) == 0 {
		return
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if r, ok := v["$ref"].(string); ok && !seen[r] {
				seen[r] = true
				kind, name, _ := strings.Cut(strings.TrimPrefix(r, "#/components/"), "/")
				var target json.RawMessage
				switch kind {
				case "schemas":
					into[name] = true
					target, _ = json.Marshal(doc.Components.Schemas[name])
				case "responses":
					target = doc.Components.Responses[name]
				case "parameters":
					target = doc.Components.Parameters[name]
				}
				var tv any
				if json.Unmarshal(target, &tv) == nil {
					walk(tv)
				}
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(v)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
