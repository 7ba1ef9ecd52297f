package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func testClient(t *testing.T, h http.HandlerFunc) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := New(Options{Remote: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestFollowEvents(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v0/ledger/sessions/a b/events" || r.URL.Query().Get("follow") != "true" || r.URL.Query().Get("after") != "7" {
			http.Error(w, `{"code":"bad","message":"unexpected request `+r.URL.String()+`"}`, 400)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		fmt.Fprint(w, `{"seq":8,"session":"a b","type":"sandbox.started"}`+"\n\n")
		fmt.Fprint(w, `{"seq":9,"session":"a b","type":"sandbox.removed"}`+"\n")
	})
	var seqs []int64
	err := c.FollowEvents(context.Background(), "a b", 7, func(ev Event) error {
		seqs = append(seqs, ev.Seq)
		return nil
	})
	if err != nil || len(seqs) != 2 || seqs[0] != 8 || seqs[1] != 9 {
		t.Fatalf("FollowEvents = %v, seqs %v; want nil, [8 9]", err, seqs)
	}

	stop := errors.New("stop")
	n := 0
	err = c.FollowEvents(context.Background(), "a b", 7, func(Event) error { n++; return stop })
	if err != stop || n != 1 {
		t.Errorf("FollowEvents with fn failing = %v after %d events; want stop after 1", err, n)
	}
}

func TestEventsQuery(t *testing.T) {
	var got string
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		got = r.URL.RawQuery
		fmt.Fprint(w, `{"events":[{"seq":3}],"next":3,"more":true}`)
	})
	for _, tc := range []struct {
		after int64
		limit int
		want  string
	}{
		{0, 0, "after=0"},
		{5, 1000, "after=5&limit=1000"},
	} {
		page, err := c.Events(context.Background(), "s", tc.after, tc.limit)
		if err != nil || got != tc.want || page.Next != 3 || !page.More || len(page.Events) != 1 {
			t.Errorf("Events(after %d, limit %d): query %q, page %+v, err %v; want query %q", tc.after, tc.limit, got, page, err, tc.want)
		}
	}
}

func TestBuildEnvironmentStatus(t *testing.T) {
	status := http.StatusCreated
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status)
		fmt.Fprint(w, `{"name":"py","fingerprint":"f1"}`)
	})
	for _, tc := range []struct {
		status int
		built  bool
	}{{http.StatusCreated, true}, {http.StatusOK, false}} {
		status = tc.status
		env, built, err := c.BuildEnvironment(context.Background(), EnvironmentRequest{Name: "py"})
		if err != nil || built != tc.built || env.Fingerprint != "f1" {
			t.Errorf("status %d: built %v, env %+v, err %v; want built %v", tc.status, built, env, err, tc.built)
		}
	}
}

// Every id, name, reference and secret the client puts in a URL path is
// escaped: the server sees exactly the value, in the segment meant for it,
// whatever characters it has. The old code sent image references and the
// port proxy's sandbox as they were ("a?b" cut the path at a query, "x/.."
// reached another endpoint).
func TestPathEscaping(t *testing.T) {
	var got []string
	mux := http.NewServeMux()
	rec := func(pattern string, keys ...string) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			for _, k := range keys {
				got = append(got, k+"="+r.PathValue(k))
			}
			fmt.Fprint(w, `{}`)
		})
	}
	rec("GET /v0/sandboxes/{id}", "id")
	rec("DELETE /v0/sandboxes/{id}/grants/{secret}", "id", "secret")
	rec("GET /v0/images/{ref...}", "ref")
	rec("DELETE /v0/images/{ref...}", "ref")
	rec("PUT /v0/secrets/{name}", "name")
	rec("/v0/sandboxes/{id}/ports/{port}/{path...}", "id", "port", "path")
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, err := New(Options{Remote: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	weird := "a?b#c d%2F/e"
	tests := []struct {
		name string
		call func() error
		want []string
	}{
		{"get", func() error { _, err := c.Get(ctx, weird); return err }, []string{"id=" + weird}},
		{"ungrant", func() error { _, err := c.Ungrant(ctx, "x/../y", "s?x"); return err }, []string{"id=x/../y", "secret=s?x"}},
		{"image", func() error { _, err := c.Image(ctx, "localhost:5000/a/b?c:1"); return err }, []string{"ref=localhost:5000/a/b?c:1"}},
		{"remove image", func() error { return c.RemoveImage(ctx, "x#y:1") }, []string{"ref=x#y:1"}},
		{"secret", func() error { _, err := c.SetSecret(ctx, "n/..", []byte("v")); return err }, []string{"name=n/.."}},
		{"port proxy", func() error {
			w := httptest.NewRecorder()
			c.PortProxy("sb?x/y", 8000).ServeHTTP(w, httptest.NewRequest("GET", "/p/q%3F?z=1", nil))
			if w.Code != 200 {
				return fmt.Errorf("status %d: %s", w.Code, w.Body)
			}
			return nil
		}, []string{"id=sb?x/y", "port=8000", "path=p/q?"}},
	}
	for _, tt := range tests {
		got = nil
		if err := tt.call(); err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("%s: the server saw %q, want %q", tt.name, got, tt.want)
		}
	}
	if u := c.PortURL("sb?x", 80, "a b?q=1"); u != srv.URL+"/v0/sandboxes/sb%3Fx/ports/80/a%20b?q=1" {
		t.Errorf("PortURL = %s", u)
	}
	// No segment can be empty, "." or "..": refused before anything is sent.
	got = nil
	for _, v := range []string{"", ".", ".."} {
		if _, err := c.Get(ctx, v); err == nil || !strings.Contains(err.Error(), "not an id") {
			t.Errorf("Get(%q) = %v, want a refusal", v, err)
		}
		if err := c.RemoveImage(ctx, "a/"+v+"/b"); err == nil {
			t.Errorf("RemoveImage(a/%s/b) = nil, want a refusal", v)
		}
		if _, err := c.Ungrant(ctx, "x", v); err == nil {
			t.Errorf("Ungrant(x, %q) = nil, want a refusal", v)
		}
		w := httptest.NewRecorder()
		c.PortProxy(v, 80).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		if w.Code != http.StatusBadRequest {
			t.Errorf("PortProxy(%q) answered %d, want 400", v, w.Code)
		}
	}
	if len(got) != 0 {
		t.Errorf("refused requests reached the server: %q", got)
	}
}

// roundTripFunc is an http.RoundTripper of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Options.Transport carries every request (a node's signing one, in a
// cluster); Call and Do reach what the client has no method for, and any
// answer but a 2xx is an *Error.
func TestTransportCallDo(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method + " " + r.URL.RequestURI() {
		case "POST /v0/cluster/things?to=b":
			if r.Header.Get("Content-Type") != "application/json" || r.Header.Get("Signed") != "yes" {
				http.Error(w, `{"code":"invalid_argument","message":"headers"}`, 400)
				return
			}
			fmt.Fprint(w, `{"sent_bytes":3}`)
		case "POST /v0/cluster/stream":
			if r.Header.Get("Content-Type") != "application/zstd" {
				http.Error(w, `{"code":"invalid_argument","message":"type"}`, 400)
				return
			}
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, `{"id":"x"}`)
		default:
			w.Header().Set(RequestIDHeader, "r1")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"code":"checkpoint_not_found","message":"no checkpoint x"}`)
		}
	}))
	defer srv.Close()
	var sent int
	rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent++
		r = r.Clone(r.Context())
		r.Header.Set("Signed", "yes")
		return http.DefaultTransport.RoundTrip(r)
	})
	c, err := New(Options{Remote: srv.URL, Transport: rt})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var out struct {
		Sent int `json:"sent_bytes"`
	}
	if err := c.Call(ctx, "POST", "/cluster/things?to=b", struct{}{}, &out); err != nil || out.Sent != 3 {
		t.Errorf("Call = %+v, %v; want 3 bytes", out, err)
	}
	resp, err := c.Do(ctx, "POST", "/cluster/stream", strings.NewReader("zz"), "application/zstd")
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("Do = %v, %v; want 201", resp, err)
	}
	resp.Body.Close()
	_, err = c.Do(ctx, "GET", "/checkpoints/x", nil, "")
	var ce *Error
	if !errors.As(err, &ce) || ce.Status != 404 || ce.Code != CodeCheckpointNotFound || ce.RequestID != "r1" {
		t.Errorf("Do of a 404 = %#v, want a checkpoint_not_found *Error of request r1", err)
	}
	if sent != 3 {
		t.Errorf("the transport carried %d requests, want 3", sent)
	}
}
