package api

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/store"
)

// fakeLedger is a LedgerReader of one session's events, of the sandbox
// named sandbox.
type fakeLedger struct {
	session string
	sandbox string
	events  []store.Event
}

func (f fakeLedger) Sessions(context.Context) ([]*store.Session, error) { return nil, nil }
func (f fakeLedger) FindSession(_ context.Context, ref string) (*store.Session, error) {
	if ref != f.session && (ref != f.sandbox || f.sandbox == "") {
		return nil, errdefs.NotFound(client.CodeSessionNotFound, "no ledger session %s", ref)
	}
	return &store.Session{Name: f.session}, nil
}
func (f fakeLedger) Events(_ context.Context, session string, after int64, limit int) ([]store.Event, error) {
	if session != f.session {
		return nil, nil // as the store: no events of a session that is not there
	}
	var out []store.Event
	for _, e := range f.events {
		if e.Seq > after && len(out) < limit {
			out = append(out, e)
		}
	}
	return out, nil
}
func (f fakeLedger) Changed() <-chan struct{} { return make(chan struct{}) }
func (f fakeLedger) Projects(context.Context) ([]*store.ProjectCounts, error) {
	return nil, nil
}
func (f fakeLedger) ProjectQuotas(context.Context) (map[string]store.Quota, error) { return nil, nil }

// The ledger's handlers run against a fake reader: pages, their end, and a
// session that is not there; a grant's data is hidden from a key that may
// not read secrets.
func TestSessionEventsPages(t *testing.T) {
	f := fakeLedger{session: "web", events: []store.Event{
		{Seq: 1, Session: "web", Type: ledger.Created},
		{Seq: 2, Session: "web", Type: ledger.SecretUngranted, Data: json.RawMessage(`{"secret":"db"}`)},
		{Seq: 3, Session: "web", Type: ledger.Stopped},
	}}
	h := (&Server{Log: slog.New(slog.DiscardHandler), Ledger: f}).Handler()
	get := func(p *auth.Principal, uri string) (*httptest.ResponseRecorder, EventPage) {
		t.Helper()
		r := httptest.NewRequest(http.MethodGet, uri, nil)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r.WithContext(auth.WithPrincipal(r.Context(), p)))
		var page EventPage
		json.Unmarshal(w.Body.Bytes(), &page)
		return w, page
	}
	w, page := get(auth.Socket, "/v0/ledger/sessions/web/events?limit=2")
	var grant ledger.SecretUngrantedData
	if w.Code != 200 || len(page.Events) != 2 || !page.More || page.Next != 2 || json.Unmarshal(page.Events[1].Data, &grant) != nil || grant.Secret != "db" {
		t.Fatalf("first page: %d %+v", w.Code, page)
	}
	w, page = get(auth.Socket, "/v0/ledger/sessions/web/events?after=2")
	if w.Code != 200 || len(page.Events) != 1 || page.More || page.Next != 3 {
		t.Fatalf("last page: %d %+v", w.Code, page)
	}
	reader := &auth.Principal{Name: "reader", Scopes: []string{auth.SandboxRead}, Project: "default"}
	if _, page = get(reader, "/v0/ledger/sessions/web/events"); len(page.Events) != 3 || page.Events[1].Data != nil {
		t.Fatalf("a key without secret:read sees the grant's data: %+v", page.Events)
	}
	if w, _ = get(auth.Socket, "/v0/ledger/sessions/nope/events"); w.Code != 404 {
		t.Fatalf("a missing session: %d %s", w.Code, w.Body)
	}
	// The session by its sandbox's name: a fork's is fork-PARENT-ID.
	f.sandbox = "web-box"
	h = (&Server{Log: slog.New(slog.DiscardHandler), Ledger: f}).Handler()
	if w, page = get(auth.Socket, "/v0/ledger/sessions/web-box/events"); w.Code != 200 || len(page.Events) != 3 {
		t.Fatalf("the session by its sandbox's name: %d %+v", w.Code, page)
	}
}
