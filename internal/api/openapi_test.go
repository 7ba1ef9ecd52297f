package api

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// routes is every METHOD and path Handler registers, in OpenAPI's spelling
// ({ref...} becomes {ref}). TestOpenAPIRoutesMatchSource keeps it equal to
// api.go, so a new endpoint fails the tests until it is listed here and
// documented in openapi.json.
var routes = []string{
	"GET /v0/openapi.json",
	"GET /v0/version",
	"GET /v0/capabilities",
	"POST /v0/sandboxes",
	"GET /v0/sandboxes",
	"GET /v0/sandboxes/{id}",
	"DELETE /v0/sandboxes/{id}",
	"POST /v0/sandboxes/{id}/stop",
	"POST /v0/sandboxes/{id}/start",
	"POST /v0/sandboxes/{id}/fork",
	"POST /v0/sandboxes/{id}/exec",
	"GET /v0/sandboxes/{id}/exec",
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
	"GET /v0/system/df",
}

var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

func loadOpenAPI(t *testing.T) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(OpenAPI(), &doc); err != nil {
		t.Fatalf("openapi.json is not valid JSON: %v", err)
	}
	return doc
}

// sourceRoutes extracts the patterns registered in api.go's Handler: every
// h("METHOD /path", ...) and mux.HandleFunc("METHOD /path", ...), without the
// catch-all "/".
func sourceRoutes(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile("api.go")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?:\bh|\bmux\.HandleFunc|\bmux\.Handle)\(\s*"([^"]*)"`)
	pat := regexp.MustCompile(`^([A-Z]+) (/\S*)$`)
	var out []string
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		p := m[1]
		if p == "/" {
			continue
		}
		pm := pat.FindStringSubmatch(p)
		if pm == nil {
			t.Errorf("api.go registers %q without a method: register each method so it can be documented", p)
			continue
		}
		path := strings.ReplaceAll(pm[2], "...}", "}")
		out = append(out, pm[1]+" "+path)
	}
	if len(out) == 0 {
		t.Fatal("found no routes in api.go: has the registration changed shape?")
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
	got := sourceRoutes(t)
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
		registered[r] = true
		method, path, _ := strings.Cut(r, " ")
		item, ok := paths[path].(map[string]any)
		if !ok {
			t.Errorf("%s is registered but openapi.json has no path %s", r, path)
			continue
		}
		if _, ok := item[strings.ToLower(method)]; !ok {
			t.Errorf("%s is registered but openapi.json has no %s under %s", r, strings.ToLower(method), path)
		}
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
