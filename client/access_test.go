package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coder/websocket"
)

// TestAccessCalls checks each access method's method, path, body and how
// it reads the answer.
func TestAccessCalls(t *testing.T) {
	var method, path, body, auth string
	answer := "{}"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		method, path, body, auth = r.Method, r.URL.EscapedPath(), string(b), r.Header.Get("Authorization")
		fmt.Fprint(w, answer)
	}))
	defer srv.Close()
	c, err := New(Options{Remote: srv.URL, APIKey: "shk_k"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name         string
		answer       string
		call         func() (any, error)
		method, path string
		body         string
		want         string // the result as JSON
	}{
		{"CreateToken", `{"id":"a1","name":"ci","project":"","scopes":["sandbox:read"],"created_at":"2025-01-01T00:00:00Z","key":"shk_x"}`,
			func() (any, error) {
				return c.CreateToken(ctx, TokenRequest{Name: "ci", Scopes: []string{"sandbox:read"}})
			},
			"POST", "/v0/tokens", `{"name":"ci","scopes":["sandbox:read"]}`,
			`{"id":"a1","name":"ci","project":"","scopes":["sandbox:read"],"created_at":"2025-01-01T00:00:00Z","key":"shk_x"}`},
		{"Tokens", `{"tokens":[{"id":"a1","name":"ci","project":"","scopes":["*"],"created_at":"2025-01-01T00:00:00Z"}]}`,
			func() (any, error) { return c.Tokens(ctx) },
			"GET", "/v0/tokens", "",
			`[{"id":"a1","name":"ci","project":"","scopes":["*"],"created_at":"2025-01-01T00:00:00Z"}]`},
		{"RevokeToken", `{"revoked":"a1"}`,
			func() (any, error) { return nil, c.RevokeToken(ctx, "ci") },
			"DELETE", "/v0/tokens/ci", "", `null`},
		{"SetSecret", `{"name":"API_KEY","created_at":"2025-01-01T00:00:00Z","updated_at":"2025-01-02T00:00:00Z"}`,
			func() (any, error) { return c.SetSecret(ctx, "API_KEY", []byte("hunter2\n")) },
			"PUT", "/v0/secrets/API_KEY", `{"value":"aHVudGVyMgo="}`,
			`{"name":"API_KEY","created_at":"2025-01-01T00:00:00Z","updated_at":"2025-01-02T00:00:00Z"}`},
		{"Secrets", `{"secrets":[{"name":"A","created_at":"2025-01-01T00:00:00Z","updated_at":"2025-01-01T00:00:00Z"}]}`,
			func() (any, error) { return c.Secrets(ctx) },
			"GET", "/v0/secrets", "",
			`[{"name":"A","created_at":"2025-01-01T00:00:00Z","updated_at":"2025-01-01T00:00:00Z"}]`},
		{"RemoveSecret", `{"removed":"A"}`,
			func() (any, error) { return nil, c.RemoveSecret(ctx, "A") },
			"DELETE", "/v0/secrets/A", "", `null`},
		{"Grant", `{"id":"3f9a1c2b7d4e","grants":[{"secret":"A","file":"/run/a","at":"2025-01-01T00:00:00Z"}]}`,
			func() (any, error) {
				sb, err := c.Grant(ctx, "py", Grant{Secret: "A", File: "/run/a"})
				if err != nil {
					return nil, err
				}
				return sb.Grants, nil
			},
			"POST", "/v0/sandboxes/py/grants", `{"secret":"A","file":"/run/a"}`,
			`[{"secret":"A","file":"/run/a","at":"2025-01-01T00:00:00Z"}]`},
		{"Grants", `{"grants":[{"secret":"A","env":"A"}]}`,
			func() (any, error) { return c.Grants(ctx, "py") },
			"GET", "/v0/sandboxes/py/grants", "", `[{"secret":"A","env":"A"}]`},
		{"Ungrant", `{"id":"3f9a1c2b7d4e","grants":[]}`,
			func() (any, error) {
				sb, err := c.Ungrant(ctx, "py", "A")
				if err != nil {
					return nil, err
				}
				return sb.ID, nil
			},
			"DELETE", "/v0/sandboxes/py/grants/A", "", `"3f9a1c2b7d4e"`},
		{"SetPolicy", `{"deny_all":true,"allow":["example.org"]}`,
			func() (any, error) {
				return c.SetPolicy(ctx, "py", Policy{DenyAll: true, Allow: []string{"example.org"}})
			},
			"PUT", "/v0/sandboxes/py/policy", `{"deny_all":true,"allow":["example.org"]}`,
			`{"deny_all":true,"allow":["example.org"]}`},
		{"GetPolicy", `{}`,
			func() (any, error) { return c.GetPolicy(ctx, "py") },
			"GET", "/v0/sandboxes/py/policy", "", `{}`},
		{"ClearPolicy", `{}`,
			func() (any, error) { return nil, c.ClearPolicy(ctx, "py") },
			"DELETE", "/v0/sandboxes/py/policy", "", `null`},
	} {
		answer = tc.answer
		got, err := tc.call()
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if method != tc.method || path != tc.path || body != tc.body {
			t.Errorf("%s sent %s %s %s; want %s %s %s", tc.name, method, path, body, tc.method, tc.path, tc.body)
		}
		if auth != "Bearer shk_k" {
			t.Errorf("%s sent Authorization %q", tc.name, auth)
		}
		if b, _ := json.Marshal(got); string(b) != tc.want {
			t.Errorf("%s = %s, want %s", tc.name, b, tc.want)
		}
	}
}

func TestAccessErrors(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `{"code":"missing_scope","message":"token ci lacks the scope secret:write"}`)
	})
	_, err := c.SetSecret(context.Background(), "A", []byte("x"))
	if e, ok := err.(*Error); !ok || e.Status != 403 || e.Code != "missing_scope" {
		t.Fatalf("SetSecret = %#v, want a 403 missing_scope *Error", err)
	}
}

func TestPortURL(t *testing.T) {
	tcp, err := New(Options{Remote: "http://10.0.0.5:7070/"})
	if err != nil {
		t.Fatal(err)
	}
	sock, err := New(Options{Socket: "/tmp/x.sock"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c    *Client
		path string
		want string
	}{
		{tcp, "", "http://10.0.0.5:7070/v0/sandboxes/py/ports/8080/"},
		{tcp, "/", "http://10.0.0.5:7070/v0/sandboxes/py/ports/8080/"},
		{tcp, "api/v1?x=1&y=2", "http://10.0.0.5:7070/v0/sandboxes/py/ports/8080/api/v1?x=1&y=2"},
		{tcp, "/a b", "http://10.0.0.5:7070/v0/sandboxes/py/ports/8080/a%20b"},
		{sock, "index.html", "http://shard/v0/sandboxes/py/ports/8080/index.html"},
	} {
		if got := tc.c.PortURL("py", 8080, tc.path); got != tc.want {
			t.Errorf("PortURL(py, 8080, %q) = %s, want %s", tc.path, got, tc.want)
		}
	}
}

// fakePorts stands for the server's port proxy: it echoes what reached it,
// and answers WebSocket upgrades with an echo of every message.
func fakePorts(t *testing.T) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/ws") {
			ws, err := websocket.Accept(w, r, nil)
			if err != nil {
				t.Errorf("accept: %v", err)
				return
			}
			defer ws.CloseNow()
			for {
				typ, msg, err := ws.Read(r.Context())
				if err != nil {
					return
				}
				ws.Write(r.Context(), typ, append([]byte("echo "+r.Header.Get("Authorization")+": "), msg...))
			}
		}
		b, _ := io.ReadAll(r.Body)
		json.NewEncoder(w).Encode(map[string]string{
			"method": r.Method, "path": r.URL.Path, "query": r.URL.RawQuery,
			"auth": r.Header.Get("Authorization"), "body": string(b), "host": r.Host,
		})
	})
}

func TestPortProxy(t *testing.T) {
	sockPath := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sockPath)
	if err != nil {
		t.Fatal(err)
	}
	unixSrv := &http.Server{Handler: fakePorts(t)}
	go unixSrv.Serve(ln)
	defer unixSrv.Close()
	tcpSrv := httptest.NewServer(fakePorts(t))
	defer tcpSrv.Close()

	overSocket, _ := New(Options{Socket: sockPath})
	overTCP, _ := New(Options{Remote: tcpSrv.URL, APIKey: "shk_k"})
	for _, tc := range []struct {
		name     string
		c        *Client
		wantAuth string
		wantHost string
	}{
		{"socket", overSocket, "", "shard"},
		{"tcp", overTCP, "Bearer shk_k", strings.TrimPrefix(tcpSrv.URL, "http://")},
	} {
		local := httptest.NewServer(tc.c.PortProxy("py", 8080))
		for _, rq := range []struct {
			method, path, wantPath string
		}{
			{"GET", "/", "/v0/sandboxes/py/ports/8080/"},
			{"POST", "/api/items?x=1", "/v0/sandboxes/py/ports/8080/api/items"},
			{"DELETE", "/a/../../../../tokens", "/v0/sandboxes/py/ports/8080/tokens"},
			{"PATCH", "/dir/", "/v0/sandboxes/py/ports/8080/dir/"},
		} {
			req, _ := http.NewRequest(rq.method, local.URL+rq.path, strings.NewReader("body"))
			p, _, _ := strings.Cut(rq.path, "?")
			req.URL.Opaque = "//" + req.URL.Host + p // send the path as written, dots and all
			req.Header.Set("Authorization", "Bearer the-apps-own")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("%s: %s %s: %v", tc.name, rq.method, rq.path, err)
			}
			var got map[string]string
			json.NewDecoder(resp.Body).Decode(&got)
			resp.Body.Close()
			_, wantQuery, _ := strings.Cut(rq.path, "?")
			if got["method"] != rq.method || got["path"] != rq.wantPath || got["query"] != wantQuery ||
				got["auth"] != tc.wantAuth || got["body"] != "body" || got["host"] != tc.wantHost {
				t.Errorf("%s: %s %s reached the server as %v; want path %s, query %q, auth %q, host %s",
					tc.name, rq.method, rq.path, got, rq.wantPath, wantQuery, tc.wantAuth, tc.wantHost)
			}
		}

		ctx := context.Background()
		ws, _, err := websocket.Dial(ctx, strings.Replace(local.URL, "http", "ws", 1)+"/ws", nil)
		if err != nil {
			t.Fatalf("%s: websocket through the proxy: %v", tc.name, err)
		}
		ws.Write(ctx, websocket.MessageText, []byte("hi"))
		_, msg, err := ws.Read(ctx)
		if want := "echo " + tc.wantAuth + ": hi"; err != nil || string(msg) != want {
			t.Errorf("%s: websocket answer %q, %v; want %q", tc.name, msg, err, want)
		}
		ws.Close(websocket.StatusNormalClosure, "")
		local.Close()
	}
}

func TestPortProxyServerDown(t *testing.T) {
	c, _ := New(Options{Socket: filepath.Join(t.TempDir(), "none.sock")})
	local := httptest.NewServer(c.PortProxy("py", 80))
	defer local.Close()
	resp, err := http.Get(local.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e Error
	json.NewDecoder(resp.Body).Decode(&e)
	if resp.StatusCode != http.StatusBadGateway || e.Code != "server_unreachable" || !strings.Contains(e.Message, "cannot reach the shard server") {
		t.Errorf("with no server: %s %+v", resp.Status, e)
	}
}
