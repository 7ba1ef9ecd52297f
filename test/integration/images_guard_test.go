package integration

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/useshards/shard/client"
)

// TestPullNotAllowedRegistry: a registry on loopback that the admin did
// not list (the harness lists only its own) is refused, 403
// registry_not_allowed, by a pull or a create, over TCP with a
// sandbox:write key and on the admin's socket alike; the server never
// connects to it.
func TestPullNotAllowedRegistry(t *testing.T) {
	e := need(t)
	var accepts atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"repositories":["host-only"]}`))
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			accepts.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/v2/x:1"

	key := token(t, "puller", "sandbox:write")
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v0/images/pull", `{"image":"` + ref + `"}`},
		{"POST", "/v0/sandboxes", `{"image":"` + ref + `"}`},
	} {
		status, er := tcpCall(t, c.method, c.path, key, []byte(c.body))
		if status != http.StatusForbidden || er.Code != "registry_not_allowed" || !strings.Contains(er.Message, "--allowed-registry") {
			t.Errorf("%s %s: %d %+v, want 403 registry_not_allowed naming --allowed-registry", c.method, c.path, status, er)
		}
	}
	_, err := e.c.Pull(ctxT(t), ref, nil)
	if ce, ok := err.(*client.Error); !ok || ce.Status != http.StatusForbidden || ce.Code != "registry_not_allowed" {
		t.Errorf("admin pull: %v, want 403 registry_not_allowed", err)
	}
	if n := accepts.Load(); n != 0 {
		t.Errorf("the unlisted registry accepted %d connections", n)
	}
}
