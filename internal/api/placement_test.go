package api

import "testing"

// Every route says where a cluster serves it, and this table says it again:
// a route added without a placement fails here (and panics in Handler), and
// a placement changed by accident shows.
func TestRoutePlacement(t *testing.T) {
	want := []struct {
		pattern string
		place   placement
	}{
		{"GET /v0/openapi.json", local},
		{"GET /v0/version", local},
		{"GET /v0/capabilities", local},
		{"GET /v0/whoami", local},
		{"GET /v0/nodes", local},
		{"GET /metrics", local},
		{"POST /v0/sandboxes", placedNode},
		{"GET /v0/sandboxes", everyNode},
		{"GET /v0/sandboxes/{id}", sandboxNode},
		{"DELETE /v0/sandboxes/{id}", sandboxNode},
		{"POST /v0/sandboxes/{id}/stop", sandboxNode},
		{"POST /v0/sandboxes/{id}/start", sandboxNode},
		{"POST /v0/sandboxes/{id}/fork", sandboxNode},
		{"POST /v0/sandboxes/{id}/exec", sandboxNode},
		{"GET /v0/sandboxes/{id}/exec", sandboxNode},
		{"GET /v0/sandboxes/{id}/files", sandboxNode},
		{"PUT /v0/sandboxes/{id}/files", sandboxNode},
		{"DELETE /v0/sandboxes/{id}/files", sandboxNode},
		{"GET /v0/sandboxes/{id}/files/stat", sandboxNode},
		{"GET /v0/sandboxes/{id}/files/list", sandboxNode},
		{"GET /v0/sandboxes/{id}/tree", sandboxNode},
		{"GET /v0/tree", local},
		{"GET /v0/sandboxes/{id}/diff", sandboxNode},
		{"POST /v0/sandboxes/{id}/checkpoints", sandboxNode},
		{"GET /v0/sandboxes/{id}/checkpoints", sandboxNode},
		{"GET /v0/checkpoints", everyNode},
		{"GET /v0/checkpoints/{id}", holderNode},
		{"DELETE /v0/checkpoints/{id}", holderNode},
		{"POST /v0/checkpoints/{id}/restore", holderNode},
		{"POST /v0/snapshots", bodySandboxNode},
		{"GET /v0/snapshots", everyNode},
		{"GET /v0/snapshots/{id}", holderNode},
		{"DELETE /v0/snapshots/{id}", holderNode},
		{"GET /v0/ledger/sessions", everyNode},
		{"GET /v0/ledger/sessions/{name}", holderNode},
		{"GET /v0/ledger/sessions/{name}/events", holderNode},
		{"POST /v0/ledger/sessions/{name}/resume", holderNode},
		{"DELETE /v0/ledger/sessions/{name}", holderNode},
		{"POST /v0/environments", bodySandboxNode},
		{"GET /v0/environments", everyNode},
		{"GET /v0/environments/{name}", holderNode},
		{"DELETE /v0/environments/{name}", local},
		{"GET /v0/system/df", local},
		{"GET /v0/images", local},
		{"POST /v0/images/pull", local},
		{"POST /v0/images/import", local},
		{"GET /v0/images/{ref...}", importerNode},
		{"DELETE /v0/images/{ref...}", importerNode},
		{"GET /v0/projects", local},
		{"PUT /v0/projects/{name}/quota", local},
		{"POST /v0/tokens", local},
		{"GET /v0/tokens", local},
		{"DELETE /v0/tokens/{id}", local},
		{"PUT /v0/secrets/{name}", local},
		{"GET /v0/secrets", local},
		{"DELETE /v0/secrets/{name}", local},
		{"POST /v0/sandboxes/{id}/grants", sandboxNode},
		{"GET /v0/sandboxes/{id}/grants", sandboxNode},
		{"DELETE /v0/sandboxes/{id}/grants/{secret}", sandboxNode},
		{"PUT /v0/sandboxes/{id}/policy", sandboxNode},
		{"GET /v0/sandboxes/{id}/policy", sandboxNode},
		{"DELETE /v0/sandboxes/{id}/policy", sandboxNode},
		{"/v0/sandboxes/{id}/ports/{port}/{path...}", sandboxNode},
	}
	got := map[string]where{}
	for _, rt := range (&Server{}).routes() {
		if _, dup := got[rt.pattern]; dup {
			t.Errorf("route %s twice", rt.pattern)
		}
		got[rt.pattern] = rt.where
	}
	if len(got) != len(want) {
		t.Errorf("%d routes, the table has %d: add the new route's placement to it", len(got), len(want))
	}
	for _, w := range want {
		g, ok := got[w.pattern]
		switch {
		case !ok:
			t.Errorf("route %s is in the table but not served", w.pattern)
		case g.place != w.place:
			t.Errorf("route %s is placed %s, want %s", w.pattern, g.place, w.place)
		case g.place == holderNode && (g.probe == nil || g.probeURI == nil):
			t.Errorf("route %s is held by a node but says not how to find it", w.pattern)
		}
	}
}

// A route without a placement is refused when the handler is made.
func TestRouteWithoutPlacementPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Handler took a route with no placement")
		}
	}()
	s := &Server{}
	s.checkPlacements([]route{{pattern: "GET /v0/new"}})
}
