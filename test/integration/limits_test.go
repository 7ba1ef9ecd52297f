package integration

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// apiErr is err as the API's error, or fails the test.
func apiErr(t *testing.T, what string, err error) *client.Error {
	t.Helper()
	var ae *client.Error
	if !errors.As(err, &ae) {
		t.Fatalf("%s: %v, want an API error", what, err)
	}
	return ae
}

// TestHostBoundsRefused: bounds past what the host can honour are a 400
// naming the bound, on both providers, and leave no sandbox behind.
// pids 1000000000 was a 500; memory 1TiB and cpu 1000 were accepted on a
// 2-cpu, 24GiB host.
func TestHostBoundsRefused(t *testing.T) {
	e := need(t)
	tests := []struct {
		name string
		req  client.CreateRequest
		want string
	}{
		{"pids 1000000000", client.CreateRequest{Pids: 1000000000}, "from 8 to 4194304"},
		{"memory 1TiB", client.CreateRequest{Memory: json.RawMessage(`"1TiB"`)}, "more than this host can give"},
		{"cpu 1000", client.CreateRequest{CPU: json.RawMessage(`1000`)}, "more than this host has"},
	}
	for _, p := range providers {
		for _, tt := range tests {
			t.Run(p+"/"+tt.name, func(t *testing.T) {
				req := tt.req
				req.Image, req.Provider, req.Name = busybox, p, "bounds-"+p
				sb, err := e.c.Create(ctxT(t), req)
				if err == nil {
					e.c.Remove(ctxT(t), sb.ID, true)
					t.Fatalf("create with %s was accepted", tt.name)
				}
				ae := apiErr(t, "create with "+tt.name, err)
				if ae.Status != 400 || !strings.Contains(ae.Message, tt.want) {
					t.Fatalf("create with %s = %d %s: %s, want 400 saying %q", tt.name, ae.Status, ae.Code, ae.Message, tt.want)
				}
				if _, err := e.c.Get(ctxT(t), req.Name); err == nil {
					t.Fatalf("a refused create left sandbox %s", req.Name)
				}
			})
		}
	}
}

// TestLedgerLimits: an exec refused for its argv leaves the ledger as it
// was; a live sandbox's session cannot be removed, a removed one's can,
// and then it is gone.
func TestLedgerLimits(t *testing.T) {
	e := need(t)
	ctx := ctxT(t)
	sb := create(t, mustCreate(busybox, "ledger-limits"))
	execOK(t, sb.ID, "true")
	before, err := e.c.GetSession(ctx, sb.Session)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		_, err := e.c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"echo", strings.Repeat("a", 200<<10)}})
		if ae := apiErr(t, "exec with a 200KiB argv", err); ae.Status != 400 || !strings.Contains(ae.Message, "at most 131072") {
			t.Fatalf("exec with a 200KiB argv = %d %s, want 400 naming the bound", ae.Status, ae.Message)
		}
	}
	after, err := e.c.GetSession(ctx, sb.Session)
	if err != nil {
		t.Fatal(err)
	}
	if after.Events != before.Events {
		t.Fatalf("5 refused execs took the session from %d to %d events, want none added", before.Events, after.Events)
	}

	err = e.c.RemoveSession(ctx, sb.Session)
	if ae := apiErr(t, "ledger rm of a live sandbox's session", err); ae.Status != 409 || ae.Code != "session_in_use" {
		t.Fatalf("ledger rm of a live sandbox's session = %d %s, want 409 session_in_use", ae.Status, ae.Code)
	}
	if err := e.c.Remove(ctx, sb.ID, true); err != nil {
		t.Fatal(err)
	}
	// Through the CLI, as a user would.
	if out, errOut, code := e.cli(t, "", "ledger", "rm", sb.Session); code != 0 {
		t.Fatalf("shard ledger rm %s: exit %d: %s%s", sb.Session, code, out, errOut)
	}
	_, err = e.c.GetSession(ctx, sb.Session)
	if ae := apiErr(t, "the removed session", err); ae.Status != 404 {
		t.Fatalf("the removed session = %d %s, want 404", ae.Status, ae.Message)
	}
}

// TestHTTPConnectionsCut: on the real server's TCP listener, with its
// default limits, a slowloris (headers a byte every 500ms) is cut at the
// header timeout (10s), and an idle keep-alive connection at the idle
// timeout (60s); both used to be held for as long as the client liked.
// The times are logged for the record; the bound checked is only that
// each was cut at all within twice its timeout.
func TestHTTPConnectionsCut(t *testing.T) {
	e := need(t)
	type result struct {
		what string
		held time.Duration
		err  error
	}
	results := make(chan result, 2)
	go func() { // slowloris
		c, err := net.Dial("tcp", e.tcp)
		if err != nil {
			results <- result{"slowloris", 0, err}
			return
		}
		defer c.Close()
		start := time.Now()
		go func() {
			for _, b := range []byte("GET /v0/version HTTP/1.1\r\nHost: x\r\nX-Slow: " + strings.Repeat("a", 200)) {
				if _, err := c.Write([]byte{b}); err != nil {
					return
				}
				time.Sleep(500 * time.Millisecond)
			}
		}()
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, err = io.Copy(io.Discard, c)
		results <- result{"slowloris", time.Since(start), err}
	}()
	go func() { // idle keep-alive
		c, err := net.Dial("tcp", e.tcp)
		if err != nil {
			results <- result{"idle keep-alive", 0, err}
			return
		}
		defer c.Close()
		fmt.Fprint(c, "GET /v0/version HTTP/1.1\r\nHost: x\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			results <- result{"idle keep-alive", 0, err}
			return
		}
		io.Copy(io.Discard, resp.Body)
		start := time.Now()
		c.SetReadDeadline(time.Now().Add(120 * time.Second))
		_, err = io.Copy(io.Discard, br)
		results <- result{"idle keep-alive", time.Since(start), err}
	}()
	for range 2 {
		r := <-results
		if r.err != nil {
			t.Errorf("%s: held %s, not cut: %v", r.what, r.held.Round(time.Millisecond), r.err)
			continue
		}
		t.Logf("%s: cut after %s", r.what, r.held.Round(time.Millisecond))
	}
}
