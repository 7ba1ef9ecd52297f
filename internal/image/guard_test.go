package image

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
)

// countingServer is an HTTP server on loopback that counts the
// connections it accepts.
type countingServer struct {
	*httptest.Server
	accepts atomic.Int64
}

func newCountingServer(t *testing.T, h http.Handler) *countingServer {
	t.Helper()
	cs := &countingServer{Server: httptest.NewUnstartedServer(h)}
	cs.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			cs.accepts.Add(1)
		}
	}
	cs.Start()
	t.Cleanup(cs.Close)
	return cs
}

func (cs *countingServer) hostport() string { return strings.TrimPrefix(cs.URL, "http://") }

func (cs *countingServer) port() string {
	_, p, _ := net.SplitHostPort(cs.hostport())
	return p
}

func TestRefusal(t *testing.T) {
	g := newGuard()
	g.blocked = []netip.Prefix{netip.MustParsePrefix("198.20.0.0/16")}
	tests := []struct {
		addr string
		want string // "" allowed; else a word of the refusal
	}{
		{"93.184.216.34", ""},
		{"2606:4700::1111", ""},
		{"64:ff9b::5db8:d822", ""}, // NAT64 of a public address
		{"127.0.0.1", "loopback"},
		{"127.9.9.9", "loopback"},
		{"::1", "loopback"},
		{"::ffff:127.0.0.1", "loopback"},
		{"::ffff:10.1.2.3", "private"},
		{"64:ff9b::7f00:1", "loopback"},
		{"10.88.0.5", "private"},
		{"172.16.0.1", "private"},
		{"192.168.1.1", "private"},
		{"100.64.0.1", "reserved"},
		{"169.254.169.254", "link-local"},
		{"fe80::1%eth0", "link-local"},
		{"fd00::1", "private"},
		{"0.0.0.0", "unspecified"},
		{"::", "unspecified"},
		{"239.1.2.3", "multicast"},
		{"ff05::1", "multicast"},
		{"255.255.255.255", "reserved"},
		{"198.18.0.1", "reserved"},
		{"2001:db8::1", "reserved"},
		{"198.20.1.2", "sandboxes"},
	}
	for _, tt := range tests {
		got := g.refusal(netip.MustParseAddr(tt.addr))
		if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
			t.Errorf("refusal(%s) = %q, want %q", tt.addr, got, tt.want)
		}
	}
}

// TestPullNotAllowed: a pull from a registry on the host's own networks,
// not listed by the admin, is refused before anything is connected.
func TestPullNotAllowed(t *testing.T) {
	ctx := own()
	reg := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	port := reg.port()
	tests := []struct {
		name, ref string
		opt       func(*Options)
		resolve   []string // what the fake resolver answers
		msg       string
	}{
		{"loopback IP", "127.0.0.1:" + port + "/x/y:1", nil, nil, "it is a loopback address"},
		{"IPv6 loopback", "[::1]:" + port + "/x/y:1", nil, nil, "loopback"},
		{"IPv4-mapped", "[::ffff:127.0.0.1]:" + port + "/x/y:1", nil, nil, "loopback"},
		{"localhost", "localhost:" + port + "/x/y:1", nil, nil, "loopback"},
		{"private", "10.1.2.3:" + port + "/x/y:1", nil, nil, "private"},
		{"name resolving to loopback", "registry.example.test:" + port + "/x/y:1", nil, []string{"93.184.216.34", "127.0.0.1"}, "loopback"},
		{"sandbox subnet", "198.20.0.9/x/y:1", func(o *Options) { o.Blocked = []netip.Prefix{netip.MustParsePrefix("198.20.0.0/16")} }, nil, "sandboxes"},
		{"not in the allowed list", "93.184.216.34/x/y:1", func(o *Options) { o.Allowed = []string{"ghcr.io"} }, nil, "not one of the registries"},
		{"docker.io not allowed, no mirror", "python:3", func(o *Options) { o.Allowed = []string{"ghcr.io"} }, nil, "not one of the registries"},
		{"localhost/ is not a registry", "localhost/x:1", nil, nil, "imported"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openStore(t, t.TempDir(), func(o *Options) {
				o.Insecure = nil
				if tt.opt != nil {
					tt.opt(o)
				}
			})
			s.guard.resolve = func(context.Context, string) ([]netip.Addr, error) {
				var out []netip.Addr
				for _, a := range tt.resolve {
					out = append(out, netip.MustParseAddr(a))
				}
				return out, nil
			}
			for _, call := range []func() error{
				func() error { return s.CheckPull(ctx, tt.ref) },
				func() error { _, err := s.Pull(ctx, tt.ref, nil); return err },
				func() error { _, err := s.Ensure(ctx, tt.ref, nil); return err },
			} {
				err := call()
				if !strings.Contains(err.Error(), tt.msg) {
					t.Errorf("err = %v, want it to say %q", err, tt.msg)
				}
				if tt.name == "localhost/ is not a registry" {
					continue // 400 (or not found for Ensure), not 403
				}
				if errdefs.KindOf(err) != errdefs.KindForbidden || errdefs.CodeOf(err) != codeNotAllowed {
					t.Errorf("err = %v (%s/%s), want forbidden/%s", err, errdefs.KindOf(err), errdefs.CodeOf(err), codeNotAllowed)
				}
				if !strings.Contains(err.Error(), "--allowed-registry") && !strings.Contains(err.Error(), "not one of") {
					t.Errorf("err = %v: does not name the flag", err)
				}
			}
			if n := reg.accepts.Load(); n != 0 {
				t.Errorf("the registry accepted %d connections", n)
			}
		})
	}
	// Listed, the same loopback registry is reached.
	s := openStore(t, t.TempDir(), func(o *Options) {
		o.Allowed = []string{"127.0.0.1:" + port}
		o.Insecure = []string{"127.0.0.1:" + port}
	})
	if _, err := s.Pull(ctx, "127.0.0.1:"+port+"/x/y:1", nil); errdefs.CodeOf(err) == codeNotAllowed {
		t.Errorf("listed registry refused: %v", err)
	}
	if reg.accepts.Load() == 0 {
		t.Error("listed registry: nothing connected")
	}
}

// TestPullHopsChecked: a registry the guard lets through cannot send the
// pull on to the host's own networks: not by a redirect, not by a token
// realm, not by a DNS answer that changes after the check (rebinding).
// Each is refused when it is dialled; the target sees no connection.
func TestPullHopsChecked(t *testing.T) {
	ctx := own()
	target := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"repositories":["secret-internal"]}`))
	}))
	tport := target.port()
	tests := []struct {
		name    string
		handler http.HandlerFunc
		msg     string
		listed  []string // hosts the admin lists besides the registry
	}{
		{"redirect https", func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v2/" {
				return
			}
			http.Redirect(w, r, "https://localhost:"+tport+"/v2/_catalog", http.StatusTemporaryRedirect)
		}, "sent the pull on to a loopback address", nil},
		{"redirect plain http", func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v2/" {
				return
			}
			http.Redirect(w, r, "http://localhost:"+tport+"/v2/_catalog", http.StatusTemporaryRedirect)
		}, "plain HTTP", nil},
		{"token realm 127.0.0.1", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="https://127.0.0.1:`+tport+`/token",service="x"`)
			w.WriteHeader(http.StatusUnauthorized)
		}, "sent the pull on to a loopback address", nil},
		{"token realm http 127.0.0.1", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="http://127.0.0.1:`+tport+`/token",service="x"`)
			w.WriteHeader(http.StatusUnauthorized)
		}, "sent the pull on to a loopback address", nil},
		{"token realm IPv4-mapped", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="https://[::ffff:127.0.0.1]:`+tport+`/token",service="x"`)
			w.WriteHeader(http.StatusUnauthorized)
		}, "sent the pull on to a loopback address", nil},
		{"token realm 10/8, no port", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="https://10.11.12.13/token",service="x"`)
			w.WriteHeader(http.StatusUnauthorized)
		}, "sent the pull on to a private address", nil},
		{"token realm unquoted", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("WWW-Authenticate", `Bearer realm=https://127.0.0.1:`+tport+`/token,service="x"`)
			w.WriteHeader(http.StatusUnauthorized)
		}, "sent the pull on to a loopback address", nil},
		{"token realm listed, refused by ggcr", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="https://127.0.0.1:`+tport+`/token",service="x"`)
			w.WriteHeader(http.StatusUnauthorized)
		}, "sent the pull on to a token service", []string{"127.0.0.1:" + tport}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := newCountingServer(t, tt.handler)
			s := openStore(t, t.TempDir(), func(o *Options) { o.Insecure = append([]string{reg.hostport()}, tt.listed...) })
			_, err := s.Pull(ctx, reg.hostport()+"/x/y:1", nil)
			if errdefs.KindOf(err) != errdefs.KindForbidden || errdefs.CodeOf(err) != codeNotAllowed || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("err = %v (%s/%s), want forbidden/%s saying %q", err, errdefs.KindOf(err), errdefs.CodeOf(err), codeNotAllowed, tt.msg)
			}
			if strings.Contains(err.Error(), "secret-internal") || strings.Contains(err.Error(), tport) {
				t.Errorf("err = %v: shows the target", err)
			}
			if reg.accepts.Load() == 0 {
				t.Error("the registry itself was not reached")
			}
			if n := target.accepts.Load(); n != 0 {
				t.Errorf("the target accepted %d connections", n)
			}
		})
	}
	t.Run("DNS rebinding", func(t *testing.T) {
		s := openStore(t, t.TempDir(), func(o *Options) { o.Insecure = nil })
		var calls atomic.Int64
		s.guard.resolve = func(context.Context, string) ([]netip.Addr, error) {
			if calls.Add(1) == 1 {
				return []netip.Addr{netip.MustParseAddr("93.184.216.34")}, nil // at the check
			}
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil // at the connect
		}
		_, err := s.Pull(ctx, "registry.example.test:"+tport+"/x/y:1", nil)
		if errdefs.CodeOf(err) != codeNotAllowed || !strings.Contains(err.Error(), "it resolves to a loopback address") {
			t.Errorf("err = %v (%s), want %s: resolves to loopback", err, errdefs.CodeOf(err), codeNotAllowed)
		}
		if calls.Load() < 2 {
			t.Errorf("resolved %d times: the connect did not resolve again", calls.Load())
		}
		if n := target.accepts.Load(); n != 0 {
			t.Errorf("the target accepted %d connections", n)
		}
	})
}

// TestPullTimeouts: a registry that accepts and never answers fails the
// pull with a timeout error, at the response-header bound or at the
// whole pull's.
func TestPullTimeouts(t *testing.T) {
	ctx := own()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() }) // silent: read nothing, answer nothing
		}
	}()
	host := ln.Addr().String()
	tests := []struct {
		name   string
		header time.Duration
		pull   time.Duration
		msg    string
	}{
		{"response header", 200 * time.Millisecond, time.Hour, "did not answer in time while pulling"},
		{"whole pull", time.Hour, 300 * time.Millisecond, "timed out after 300ms (shard serve --pull-timeout)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openStore(t, t.TempDir(), func(o *Options) { o.Insecure = []string{host}; o.PullTimeout = tt.pull })
			s.guard.headerTimeout, s.guard.tlsTimeout = tt.header, tt.header
			_, err := s.Pull(ctx, host+"/x/y:1", nil)
			if errdefs.CodeOf(err) != codeTimeout || !strings.Contains(err.Error(), tt.msg) || !strings.Contains(err.Error(), "timed out") {
				t.Errorf("err = %v (%s), want %s saying %q", err, errdefs.CodeOf(err), codeTimeout, tt.msg)
			}
		})
	}
}

// TestPullErrorShowsNoBody: what a registry answers never reaches the
// error's text, only its status and well-formed codes.
func TestPullErrorShowsNoBody(t *testing.T) {
	ctx := own()
	const secret = "SECRET-d41d8cd98f00"
	tests := []struct {
		name   string
		status int
		body   string
		want   string
	}{
		{"plain body", http.StatusInternalServerError, secret + " root:x:0:0", "HTTP 500 Internal Server Error"},
		{"registry errors", http.StatusBadRequest, `{"errors":[{"code":"UNSUPPORTED","message":"` + secret + `","detail":"` + secret + `"},{"code":"` + secret + `"}]}`, "HTTP 400 Bad Request (UNSUPPORTED)"},
		{"not JSON manifest", http.StatusOK, secret, "is not a valid image"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v2/" {
					return
				}
				if tt.status == http.StatusOK {
					w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
				}
				w.WriteHeader(tt.status)
				w.Write([]byte(tt.body))
			}))
			s := openStore(t, t.TempDir(), func(o *Options) { o.Insecure = []string{reg.hostport()} })
			_, err := s.Pull(ctx, reg.hostport()+"/x/y:1", nil)
			if err == nil || strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "root:x") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to say %q and show nothing of the body", err, tt.want)
			}
		})
	}
}

// syncBuf is a log destination tests read while the store writes.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestPullFailureLogged: a failed pull, whose error the API sends in its
// stream (or as create's answer), is logged once at warn with its
// reference, its project and the cause its message leaves out, bounded.
func TestPullFailureLogged(t *testing.T) {
	ctx := project.With(context.Background(), "pa")
	realm := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="https://127.0.0.1:9/token"`)
		w.WriteHeader(http.StatusUnauthorized)
	}))
	cut := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			return
		}
		c, _, _ := http.NewResponseController(w).Hijack()
		c.Close()
	}))
	huge := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			return
		}
		w.WriteHeader(http.StatusBadRequest) // not tried again
		w.Write([]byte(strings.Repeat("x", 60<<10)))
	}))
	unlisted := newCountingServer(t, http.NotFoundHandler())
	tests := []struct {
		name  string
		pull  func(s *Store, ref string) error
		ref   string
		cause string // in the log, not in the error
	}{
		{"token realm refused", pull, realm.hostport() + "/x/y:1", `token realm \"https://127.0.0.1:9/token\" refused: a loopback address`},
		{"connection cut", pull, cut.hostport() + "/x/y:1", "EOF"},
		{"create's pull", ensure, realm.hostport() + "/x/y:2", "refused: a loopback address"},
		{"error body bounded", pull, huge.hostport() + "/x/y:1", "unexpected status code 400 Bad Request: xxx"},
		{"refused before the pull", func(s *Store, ref string) error { return s.CheckPull(ctx, ref) }, unlisted.hostport() + "/x/y:1", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf syncBuf
			s := openStore(t, t.TempDir(), func(o *Options) {
				o.Insecure = []string{realm.hostport(), cut.hostport(), huge.hostport()}
				o.Logger = slog.New(slog.NewTextHandler(&buf, nil))
			})
			err := tt.pull(s, tt.ref)
			if err == nil {
				t.Fatal("the pull did not fail")
			}
			var lines []string
			for _, l := range strings.Split(buf.String(), "\n") {
				if strings.Contains(l, `msg="pull failed"`) {
					lines = append(lines, l)
				}
			}
			if len(lines) != 1 {
				t.Fatalf("%d lines say the pull failed, want 1; log:\n%s", len(lines), buf.String())
			}
			l := lines[0]
			for _, want := range []string{"level=WARN", "image=" + tt.ref, "project=pa", "code=" + errdefs.CodeOf(err), tt.cause} {
				if !strings.Contains(l, want) {
					t.Errorf("log line %s\ndoes not say %s", l, want)
				}
			}
			if tt.cause != "" && strings.Contains(err.Error(), tt.cause) {
				t.Errorf("err = %v: the test's cause is in the message too", err)
			}
			if len(l) > 2*maxPullLog {
				t.Errorf("log line is %d bytes", len(l))
			}
		})
	}
}

func pull(s *Store, ref string) error {
	_, err := s.Pull(project.With(context.Background(), "pa"), ref, nil)
	return err
}

func ensure(s *Store, ref string) error {
	_, err := s.Ensure(project.With(context.Background(), "pa"), ref, nil)
	return err
}
