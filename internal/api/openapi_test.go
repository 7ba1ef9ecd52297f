package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/fsdiff"
	"github.com/useshards/shard/internal/lineage"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/sandbox"
)

// routes is every METHOD and path Handler registers, in OpenAPI's spelling
// ({ref...} becomes {ref}); a path alone is a pattern registered without a
// method, which takes them all (the port proxy): openapi.json documents it
// under each of proxyMethods. TestOpenAPIRoutesMatchSource keeps it equal
// to routes() in api.go, so a new endpoint fails the tests until it is
// listed here and documented in openapi.json.
var routes = []string{
	"GET /v0/openapi.json",
	"GET /v0/version",
	"GET /v0/capabilities",
	"GET /v0/whoami",
	"GET /v0/nodes",
	"GET /metrics",
	"POST /v0/sandboxes",
	"GET /v0/sandboxes",
	"GET /v0/sandboxes/{id}",
	"DELETE /v0/sandboxes/{id}",
	"POST /v0/sandboxes/{id}/stop",
	"POST /v0/sandboxes/{id}/start",
	"POST /v0/sandboxes/{id}/fork",
	"POST /v0/sandboxes/{id}/exec",
	"GET /v0/sandboxes/{id}/exec",
	"GET /v0/sandboxes/{id}/files",
	"PUT /v0/sandboxes/{id}/files",
	"DELETE /v0/sandboxes/{id}/files",
	"GET /v0/sandboxes/{id}/files/stat",
	"GET /v0/sandboxes/{id}/files/list",
	"GET /v0/sandboxes/{id}/tree",
	"GET /v0/tree",
	"GET /v0/sandboxes/{id}/diff",
	"GET /v0/images",
	"POST /v0/images/pull",
	"POST /v0/images/import",
	"GET /v0/images/{ref}",
	"DELETE /v0/images/{ref}",
	"POST /v0/sandboxes/{id}/checkpoints",
	"GET /v0/sandboxes/{id}/checkpoints",
	"GET /v0/checkpoints",
	"GET /v0/checkpoints/{id}",
	"DELETE /v0/checkpoints/{id}",
	"POST /v0/checkpoints/{id}/restore",
	"POST /v0/snapshots",
	"GET /v0/snapshots",
	"GET /v0/snapshots/{id}",
	"DELETE /v0/snapshots/{id}",
	"GET /v0/ledger/sessions",
	"GET /v0/ledger/sessions/{name}",
	"GET /v0/ledger/sessions/{name}/events",
	"POST /v0/ledger/sessions/{name}/resume",
	"POST /v0/environments",
	"GET /v0/environments",
	"GET /v0/environments/{name}",
	"DELETE /v0/environments/{name}",
	"DELETE /v0/ledger/sessions/{name}",
	"GET /v0/system/df",
	"GET /v0/projects",
	"POST /v0/tokens",
	"PUT /v0/projects/{name}/quota",
	"GET /v0/tokens",
	"DELETE /v0/tokens/{id}",
	"PUT /v0/secrets/{name}",
	"GET /v0/secrets",
	"DELETE /v0/secrets/{name}",
	"POST /v0/sandboxes/{id}/grants",
	"GET /v0/sandboxes/{id}/grants",
	"DELETE /v0/sandboxes/{id}/grants/{secret}",
	"PUT /v0/sandboxes/{id}/policy",
	"GET /v0/sandboxes/{id}/policy",
	"DELETE /v0/sandboxes/{id}/policy",
	"/v0/sandboxes/{id}/ports/{port}/{path}", // any method: the port proxy
}

// proxyMethods are the methods openapi.json documents a method-less route
// under (it takes any).
var proxyMethods = []string{"get", "head", "post", "put", "patch", "delete", "options"}

var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

func loadOpenAPI(t *testing.T) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(OpenAPI(), &doc); err != nil {
		t.Fatalf("openapi.json is not valid JSON: %v", err)
	}
	return doc
}

// openAPIRoute is a route pattern in OpenAPI's spelling: "METHOD /path",
// or "/path" for a method-less pattern; {x...} becomes {x}.
func openAPIRoute(pattern string) string {
	return strings.ReplaceAll(pattern, "...}", "}")
}

// splitRoute returns a route's method (lower case; "" when it has none)
// and path.
func splitRoute(r string) (method, path string) {
	if m, p, ok := strings.Cut(r, " "); ok {
		return strings.ToLower(m), p
	}
	return "", r
}

// sourceRoutes is every pattern routes() registers, in OpenAPI's spelling,
// with the scope it declares.
func sourceRoutes(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, rt := range (&Server{}).routes() {
		r := openAPIRoute(rt.pattern)
		if _, dup := out[r]; dup {
			t.Errorf("routes() registers %s twice", r)
		}
		out[r] = rt.scope
	}
	if len(out) == 0 {
		t.Fatal("routes() is empty")
	}
	return out
}

// operations returns the operations openapi.json documents for a route:
// one, or for a method-less route one per method in proxyMethods.
func operations(t *testing.T, doc map[string]any, route string) map[string]map[string]any {
	t.Helper()
	method, path := splitRoute(route)
	paths, _ := doc["paths"].(map[string]any)
	item, ok := paths[path].(map[string]any)
	if !ok {
		t.Errorf("%s is registered but openapi.json has no path %s", route, path)
		return nil
	}
	methods := []string{method}
	if method == "" {
		methods = proxyMethods
	}
	out := map[string]map[string]any{}
	for _, m := range methods {
		op, ok := item[m].(map[string]any)
		if !ok {
			t.Errorf("%s is registered but openapi.json has no %s under %s", route, m, path)
			continue
		}
		out[m] = op
	}
	return out
}

func TestOpenAPIVersion(t *testing.T) {
	doc := loadOpenAPI(t)
	if v, _ := doc["openapi"].(string); v != "3.0.3" {
		t.Fatalf("openapi = %v, want 3.0.3", doc["openapi"])
	}
	info, _ := doc["info"].(map[string]any)
	if info["title"] != "shard API" || info["version"] != "v0" {
		t.Errorf("info = %v %v, want shard API v0", info["title"], info["version"])
	}
}

func TestOpenAPIRoutesMatchSource(t *testing.T) {
	var got []string
	for r := range sourceRoutes(t) {
		got = append(got, r)
	}
	want := slices.Clone(routes)
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Fatalf("the routes in api.go changed; update the list in openapi_test.go (and openapi.json):\napi.go: %q\nlist:   %q", got, want)
	}
}

func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	doc := loadOpenAPI(t)
	paths, ok := doc["paths"].(map[string]any)
	if !ok {
		t.Fatal("openapi.json has no paths")
	}
	registered := map[string]bool{}
	for _, r := range routes {
		operations(t, doc, r)
		method, path := splitRoute(r)
		if method == "" {
			for _, m := range httpMethods {
				registered[strings.ToUpper(m)+" "+path] = true
			}
			continue
		}
		registered[r] = true
	}
	opIDs := map[string]string{}
	for path, v := range paths {
		item, _ := v.(map[string]any)
		n := 0
		for _, m := range httpMethods {
			op, ok := item[m].(map[string]any)
			if !ok {
				continue
			}
			n++
			r := strings.ToUpper(m) + " " + path
			if !registered[r] {
				t.Errorf("openapi.json documents %s, which Handler does not register", r)
			}
			id, _ := op["operationId"].(string)
			if id == "" {
				t.Errorf("%s has no operationId", r)
			} else if prev, dup := opIDs[id]; dup {
				t.Errorf("operationId %s is used by %s and %s", id, prev, r)
			}
			opIDs[id] = r
			if s, _ := op["summary"].(string); s == "" {
				t.Errorf("%s has no summary", r)
			}
			if resp, _ := op["responses"].(map[string]any); len(resp) == 0 {
				t.Errorf("%s has no responses", r)
			}
		}
		if n == 0 {
			t.Errorf("openapi.json path %s has no operations", path)
		}
	}
}

// TestOpenAPIRequiredScopes checks that every operation's x-required-scope
// is the scope its route declares in routes(), that the operations anyone
// may call say so (security: []) and the others answer 401 and 403.
func TestOpenAPIRequiredScopes(t *testing.T) {
	doc := loadOpenAPI(t)
	for r, scope := range sourceRoutes(t) {
		for m, op := range operations(t, doc, r) {
			_, path := splitRoute(r)
			at := strings.ToUpper(m) + " " + path
			got, ok := op["x-required-scope"].(string)
			if !ok {
				t.Errorf("%s: no x-required-scope (want %q)", at, scope)
			} else if got != scope {
				t.Errorf("%s: x-required-scope %q, routes() declares %q", at, got, scope)
			}
			if scope != auth.None && scope != auth.AnyKey && !auth.Valid(scope) {
				t.Errorf("%s: routes() declares %q, which is not a scope a token may hold", at, scope)
			}
			sec, hasSec := op["security"].([]any)
			resp, _ := op["responses"].(map[string]any)
			if scope == auth.None {
				if !hasSec || len(sec) != 0 {
					t.Errorf("%s needs no key: it must say security: [] (has %v)", at, op["security"])
				}
				continue
			}
			if _, ok := op["security"]; ok {
				t.Errorf("%s overrides the global security requirement", at)
			}
			if _, ok := resp["401"]; !ok {
				t.Errorf("%s has no 401 answer", at)
			}
			if scope == auth.AnyKey { // any valid key: never 403
				if _, ok := resp["403"]; ok {
					t.Errorf("%s takes any key: it has no 403 answer", at)
				}
				continue
			}
			if _, ok := resp["403"]; !ok {
				t.Errorf("%s has no 403 answer", at)
			}
			if !strings.Contains(fmt.Sprint(resp["403"]), "missing_scope") {
				t.Errorf("%s: its 403 does not mention missing_scope", at)
			}
		}
	}
}

func TestOpenAPISecurity(t *testing.T) {
	doc := loadOpenAPI(t)
	comps, _ := doc["components"].(map[string]any)
	schemes, _ := comps["securitySchemes"].(map[string]any)
	b, _ := schemes["bearerAuth"].(map[string]any)
	if b["type"] != "http" || b["scheme"] != "bearer" {
		t.Errorf("securitySchemes.bearerAuth = %v, want an http bearer scheme", schemes["bearerAuth"])
	}
	if len(schemes) != 1 {
		t.Errorf("securitySchemes = %v, want bearerAuth alone", schemes)
	}
	if got, _ := json.Marshal(doc["security"]); string(got) != `[{"bearerAuth":[]}]` {
		t.Errorf("security = %s, want [{\"bearerAuth\":[]}]", got)
	}
	for _, name := range []string{"TokenRequest", "Token", "TokenCreated"} {
		schema, _ := resolvePointer(doc, "/components/schemas/"+name+"/properties/scopes/items/enum")
		var got []string
		for _, s := range schema.([]any) {
			got = append(got, s.(string))
		}
		if !slices.Equal(got, auth.Known) {
			t.Errorf("%s.scopes enum = %q, want auth.Known %q", name, got, auth.Known)
		}
	}
}

// TestOpenAPIErrorCodes: the enum of Error.code is client.Codes, every code
// the server emits (TestCodesAreConstants keeps them constants of client),
// and every error example of the document shows one of them.
func TestOpenAPIErrorCodes(t *testing.T) {
	doc := loadOpenAPI(t)
	enum, ok := resolvePointer(doc, "/components/schemas/Error/properties/code/enum")
	if !ok {
		t.Fatal("Error.code has no enum")
	}
	var got []string
	for _, c := range enum.([]any) {
		got = append(got, c.(string))
	}
	if !slices.Equal(got, client.Codes) {
		t.Errorf("Error.code enum = %q,\nwant client.Codes %q", got, client.Codes)
	}
	// Examples of errors: {"code", "message"} as an example's value, or
	// as an inline example.
	var walk func(at string, v any)
	walk = func(at string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if code, ok := v["code"].(string); ok {
				if _, msg := v["message"].(string); msg && !client.IsCode(code) {
					t.Errorf("%s: an example's code %q is not one the server emits (client.Codes)", at, code)
				}
			}
			for k, e := range v {
				walk(at+"."+k, e)
			}
		case []any:
			for i, e := range v {
				walk(fmt.Sprintf("%s.%d", at, i), e)
			}
		}
	}
	walk("paths", doc["paths"])
	walk("components", doc["components"])
}

// TestOpenAPISchemasMatchTypes checks that the schemas of the wire types
// name exactly their JSON fields: some of the client package's (its own
// test, client/openapi_test.go, checks them all, with their JSON types),
// and the server's own types that the client does not share: the
// providers' capabilities and the payloads of the exec stream's frames.
func TestOpenAPISchemasMatchTypes(t *testing.T) {
	doc := loadOpenAPI(t)
	for name, v := range map[string]any{
		"Sandbox": Sandbox{}, "Token": Token{}, "TokenRequest": TokenRequest{}, "TokenCreated": TokenCreated{},
		"Secret": Secret{}, "SecretRequest": SecretRequest{}, "Grant": Grant{}, "Policy": Policy{},
		"Error": Error{}, "ForkRequest": ForkRequest{}, "ForkResponse": ForkResponse{},
		"Checkpoint": Checkpoint{}, "SandboxRemoved": SandboxRemoved{}, "Snapshot": Snapshot{}, "Environment": Environment{},
		"Capabilities": provider.Capabilities{},
		"ExecStarted":  ExecStarted{}, "ExecExit": ExecExit{}, "ExecResize": ExecResize{}, "ExecSignal": ExecSignal{},
		"TreeNode": lineage.Node{}, "Change": fsdiff.Change{}, "Diff": sandbox.DiffResult{}, "DiffSide": sandbox.DiffSide{},
	} {
		props, ok := resolvePointer(doc, "/components/schemas/"+name+"/properties")
		if !ok {
			t.Errorf("openapi.json has no schema %s", name)
			continue
		}
		var got []string
		for k := range props.(map[string]any) {
			got = append(got, k)
		}
		want := jsonFields(reflect.TypeOf(v))
		sort.Strings(got)
		sort.Strings(want)
		if !slices.Equal(got, want) {
			t.Errorf("schema %s has the properties %q; the Go type's JSON fields are %q", name, got, want)
		}
	}
}

// jsonFields lists the JSON names of a struct's fields, embedded ones'
// included.
func jsonFields(typ reflect.Type) []string {
	var out []string
	for f := range typ.Fields() {
		tag := f.Tag.Get("json")
		if tag == "-" || !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			t := f.Type
			if t.Kind() == reflect.Pointer {
				t = t.Elem()
			}
			out = append(out, jsonFields(t)...)
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	return out
}

// TestOpenAPIRefsResolve checks every $ref points at something that exists
// under #/components.
func TestOpenAPIRefsResolve(t *testing.T) {
	doc := loadOpenAPI(t)
	n := 0
	var walk func(v any, at string)
	walk = func(v any, at string) {
		switch v := v.(type) {
		case map[string]any:
			if r, ok := v["$ref"]; ok {
				n++
				s, _ := r.(string)
				if !strings.HasPrefix(s, "#/components/") {
					t.Errorf("%s: $ref %q is not a local component", at, r)
				} else if _, ok := resolvePointer(doc, strings.TrimPrefix(s, "#")); !ok {
					t.Errorf("%s: $ref %q does not resolve", at, s)
				}
			}
			for k, c := range v {
				walk(c, at+"/"+k)
			}
		case []any:
			for i, c := range v {
				walk(c, at+"/"+strconv.Itoa(i))
			}
		}
	}
	walk(doc, "#")
	if n == 0 {
		t.Error("openapi.json has no $ref at all")
	}
}

// resolvePointer follows a JSON pointer ("/components/schemas/Sandbox").
func resolvePointer(doc any, ptr string) (any, bool) {
	cur := doc
	for _, tok := range strings.Split(strings.TrimPrefix(ptr, "/"), "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[tok]; !ok {
			return nil, false
		}
	}
	return cur, true
}

func TestOpenAPIServed(t *testing.T) {
	h := (&Server{Log: slog.New(slog.NewTextHandler(io.Discard, nil))}).Handler()
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v0/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v0/openapi.json: %s", resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	if !bytes.Equal(body, OpenAPI()) {
		t.Error("GET /v0/openapi.json did not answer with the embedded document")
	}
	var doc map[string]any
	if err := json.Unmarshal(body, &doc); err != nil || doc["openapi"] != "3.0.3" {
		t.Errorf("served document: openapi = %v, err = %v", doc["openapi"], err)
	}
}
