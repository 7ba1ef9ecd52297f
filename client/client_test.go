package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
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
