package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/sandbox"
	"github.com/useshards/shard/internal/store"
)

// admin sends r as the Unix socket's administrator does.
func admin(r *http.Request) *http.Request {
	return r.WithContext(auth.WithPrincipal(r.Context(), &auth.Principal{Admin: true}))
}

// Every bad value is a 400 saying what is allowed, before the server does
// anything: the test server has no sandbox service, so a request that got
// past its checks would fail with a 500 instead. The old code let each of
// these through (pids wrapped, memory_mib overflowed to 512MiB, cpu 0.0001
// became the default cpu, tags took '/' and NUL, an import name took
// "../x"), or answered them with a 500.
func TestHandlerRefusesBadInput(t *testing.T) {
	tests := []struct {
		name, method, path, body string
		want                     string // part of the message
	}{
		{"pids max int64", "POST", "/v0/sandboxes", `{"image":"busybox","pids":9223372036854775807}`, "from 8 to 4194304"},
		{"pids 2^31", "POST", "/v0/sandboxes", `{"image":"busybox","pids":2147483648}`, "from 8 to 4194304"},
		{"pids too few", "POST", "/v0/sandboxes", `{"image":"busybox","pids":3}`, "from 8 to 4194304"},
		{"memory_mib wraps to 512MiB", "POST", "/v0/sandboxes", `{"image":"busybox","memory_mib":17592186044928}`, "too large"},
		{"memory_mib 10^15", "POST", "/v0/sandboxes", `{"image":"busybox","memory_mib":1000000000000000}`, "too large"},
		{"memory_mib past the host", "POST", "/v0/sandboxes", `{"image":"busybox","memory_mib":1073741824}`, "more than this host can give"},
		{"memory past int64", "POST", "/v0/sandboxes", `{"image":"busybox","memory":"17592186044928MiB"}`, "too large"},
		{"memory number past int64", "POST", "/v0/sandboxes", `{"image":"busybox","memory":1e30}`, "memory"},
		{"memory not whole bytes", "POST", "/v0/sandboxes", `{"image":"busybox","memory":"0.3MiB"}`, "whole number of bytes"},
		{"cpu 0.0001 string", "POST", "/v0/sandboxes", `{"image":"busybox","cpu":"0.0001"}`, "finer than"},
		{"cpu 0.0001 number", "POST", "/v0/sandboxes", `{"image":"busybox","cpu":0.0001}`, "finer than"},
		{"cpu 1e-4", "POST", "/v0/sandboxes", `{"image":"busybox","cpu":1e-4}`, "finer than"},
		{"cpu past the host", "POST", "/v0/sandboxes", `{"image":"busybox","cpu":100000}`, "more than this host has"},
		{"cpu negative", "POST", "/v0/sandboxes", `{"image":"busybox","cpu":-1}`, "cpu"},
		{"disk past int64", "POST", "/v0/sandboxes", `{"image":"busybox","disk":"9EiB"}`, "disk"},
		{"disk 2PiB", "POST", "/v0/sandboxes", `{"image":"busybox","disk":"2PiB"}`, "at most 1PiB"},
		{"env key with =", "POST", "/v0/sandboxes", `{"image":"busybox","env":{"A=B":"c"}}`, "not an environment variable name"},
		{"env NUL", "POST", "/v0/sandboxes", `{"image":"busybox","env":["A=b\u0000"]}`, "NUL"},
		{"bad name", "POST", "/v0/sandboxes", `{"image":"busybox","name":"../x"}`, "not valid"},
		{"bad environment name", "POST", "/v0/sandboxes", `{"environment":"../x"}`, "not valid"},
		{"fork count 65", "POST", "/v0/sandboxes/x/fork", `{"count":65}`, "from 1 to 64"},
		{"fork count -1", "POST", "/v0/sandboxes/x/fork", `{"count":-1}`, "from 1 to 64"},
		{"fork tag slash", "POST", "/v0/sandboxes/x/fork", `{"tag":"a/b"}`, "at most 128"},
		{"fork name", "POST", "/v0/sandboxes/x/fork", `{"name":"a b"}`, "not valid"},
		{"fork names too long with count", "POST", "/v0/sandboxes/x/fork", `{"name":"` + strings.Repeat("a", 62) + `","count":10}`, "named"},
		{"checkpoint tag slash", "POST", "/v0/sandboxes/x/checkpoints", `{"tag":"a/b"}`, "at most 128"},
		{"checkpoint tag NUL", "POST", "/v0/sandboxes/x/checkpoints", `{"tag":"a\u0000"}`, "at most 128"},
		{"checkpoint tag 300", "POST", "/v0/sandboxes/x/checkpoints", `{"tag":"` + strings.Repeat("t", 300) + `"}`, "at most 128"},
		{"restore name", "POST", "/v0/checkpoints/x/restore", `{"name":"../x"}`, "not valid"},
		{"resume name", "POST", "/v0/ledger/sessions/x/resume", `{"name":"a/b"}`, "not valid"},
		{"snapshot name", "POST", "/v0/snapshots", `{"sandbox":"x","name":".."}`, "not valid"},
		{"environment name", "POST", "/v0/environments", `{"name":"../x","image":"busybox"}`, "not valid"},
		{"environment cpu", "POST", "/v0/environments", `{"name":"e","image":"busybox","cpu":"0.0001"}`, "finer than"},
		{"environment memory_mib", "POST", "/v0/environments", `{"name":"e","image":"busybox","memory_mib":17592186044928}`, "too large"},
		{"environment setup NUL", "POST", "/v0/environments", `{"name":"e","image":"busybox","setup":[["a\u0000"]]}`, "NUL"},
		{"environment setup empty", "POST", "/v0/environments", `{"name":"e","image":"busybox","setup":[[]]}`, "no command"},
		{"environment fingerprint", "POST", "/v0/environments", `{"name":"e","image":"busybox","fingerprint":"a b"}`, "fingerprint"},
		{"exec timeout tiny", "POST", "/v0/sandboxes/x/exec", `{"argv":["true"],"timeout":0.0001}`, "finer than a millisecond"},
		{"exec timeout huge", "POST", "/v0/sandboxes/x/exec", `{"argv":["true"],"timeout":1e300}`, "timeout"},
		{"exec timeout 1e20 seconds", "POST", "/v0/sandboxes/x/exec", `{"argv":["true"],"timeout":100000000000000000000}`, "out of range"},
		{"exec timeout ns", "POST", "/v0/sandboxes/x/exec", `{"argv":["true"],"timeout":"1ns"}`, "finer than a millisecond"},
		{"exec argv NUL", "POST", "/v0/sandboxes/x/exec", `{"argv":["a\u0000b"]}`, "NUL"},
		{"exec no argv", "POST", "/v0/sandboxes/x/exec", `{"argv":[]}`, "no command"},
		{"exec env key with =", "POST", "/v0/sandboxes/x/exec", `{"argv":["env"],"env":{"A=B":"c"}}`, "not an environment variable name"},
		{"exec workdir NUL", "POST", "/v0/sandboxes/x/exec", `{"argv":["true"],"workdir":"/a\u0000"}`, "NUL"},
		{"grant env with =", "POST", "/v0/sandboxes/x/grants", `{"secret":"s","env":"A=B"}`, "not an environment variable name"},
		{"grant file relative", "POST", "/v0/sandboxes/x/grants", `{"secret":"s","file":"etc/x"}`, "clean absolute"},
		{"grant file dotdot", "POST", "/v0/sandboxes/x/grants", `{"secret":"s","file":"/etc/../x"}`, "clean absolute"},
		{"grant file NUL", "POST", "/v0/sandboxes/x/grants", `{"secret":"s","file":"/a\u0000"}`, "NUL"},
		{"grant bad secret name", "POST", "/v0/sandboxes/x/grants", `{"secret":"../s"}`, "secret name"},
		{"policy entry", "PUT", "/v0/sandboxes/x/policy", `{"allow":["not an address!"]}`, "policy"},
		{"token name", "POST", "/v0/tokens", `{"name":"../t","scopes":["*"]}`, "not valid"},
		{"token scope", "POST", "/v0/tokens", `{"name":"t","scopes":["root"]}`, "unknown scope"},
		{"secret empty", "PUT", "/v0/secrets/s", `{"value":""}`, "empty"},
		{"secret bad name", "PUT", "/v0/secrets/..x", `{"value":"eA=="}`, "secret name"},
		{"port 0", "GET", "/v0/sandboxes/x/ports/0/", ``, "from 1 to 65535"},
		{"port +80", "GET", "/v0/sandboxes/x/ports/+80/", ``, "from 1 to 65535"},
		{"port 65536", "GET", "/v0/sandboxes/x/ports/65536/", ``, "from 1 to 65535"},
		{"ledger after", "GET", "/v0/ledger/sessions/x/events?after=-1", ``, "after"},
		{"ledger limit", "GET", "/v0/ledger/sessions/x/events?limit=0", ``, "limit"},
		{"import name dotdot", "POST", "/v0/images/import?name=../x", ``, "not a path component"},
		{"import name registry dotdot", "POST", "/v0/images/import?name=..%2Fx", ``, "image reference"},
		{"import name upper", "POST", "/v0/images/import?name=X", ``, "image reference"},
	}
	s, _ := testServer(t)
	h := s.Handler()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, admin(httptest.NewRequest(tt.method, tt.path, strings.NewReader(tt.body))))
			var got Error
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
				t.Fatalf("body %q is not the error JSON: %v", w.Body, err)
			}
			if w.Code != http.StatusBadRequest || got.Code != "invalid_argument" || !strings.Contains(got.Message, tt.want) {
				t.Fatalf("%s %s %s = %d %+v; want 400 invalid_argument saying %q", tt.method, tt.path, tt.body, w.Code, got, tt.want)
			}
		})
	}
}

// What passes is passed on as it was given: no bound changed, rounded or
// defaulted on the way.
func TestParseCreateKeepsBounds(t *testing.T) {
	lim := sandbox.Limits{MemoryBytes: 8 << 30, CPUMillis: 4000}
	tests := []struct {
		body string
		want sandbox.CreateRequest
	}{
		{`{"image":"busybox"}`, sandbox.CreateRequest{Image: "busybox"}},
		{`{"image":"busybox","memory":"512MiB","cpu":0.5,"disk":"1GiB","pids":100}`,
			sandbox.CreateRequest{Image: "busybox", Bounds: store.Bounds{MemoryBytes: 512 << 20, CPUMillis: 500, DiskBytes: 1 << 30, Pids: 100}}},
		{`{"image":"busybox","memory":1073741824,"cpu":"250m","disk":2147483648}`,
			sandbox.CreateRequest{Image: "busybox", Bounds: store.Bounds{MemoryBytes: 1 << 30, CPUMillis: 250, DiskBytes: 2 << 30}}},
		{`{"image":"busybox","memory_mib":8192,"cpu":4,"pids":4194304}`,
			sandbox.CreateRequest{Image: "busybox", Bounds: store.Bounds{MemoryBytes: 8 << 30, CPUMillis: 4000, Pids: 4194304}}},
		{`{"image":"busybox","cpu":0.01,"memory":1e9}`, sandbox.CreateRequest{Image: "busybox", Bounds: store.Bounds{CPUMillis: 10, MemoryBytes: 1e9}}},
		{`{"image":"busybox","env":{"B":"2","A":"1=x"}}`, sandbox.CreateRequest{Image: "busybox", Env: []string{"A=1=x", "B=2"}}},
		{`{"from_snapshot":"snap","name":"work"}`, sandbox.CreateRequest{FromSnapshot: "snap", Name: "work"}},
	}
	for _, tt := range tests {
		_, got, err := parseCreate(httptest.NewRequest("POST", "/v0/sandboxes", strings.NewReader(tt.body)), lim)
		if err != nil {
			t.Errorf("parseCreate(%s) = %v", tt.body, err)
			continue
		}
		gb, _ := json.Marshal(got)
		wb, _ := json.Marshal(tt.want)
		if string(gb) != string(wb) {
			t.Errorf("parseCreate(%s) = %s, want %s", tt.body, gb, wb)
		}
	}
}

func TestExecTimeout(t *testing.T) {
	for _, tt := range []struct {
		raw  string
		want int64
		err  string
	}{
		{``, 0, ""}, {`null`, 0, ""}, {`30`, 30000, ""}, {`0.5`, 500, ""}, {`0.001`, 1, ""}, {`"30s"`, 30000, ""},
		{`"1.5ms"`, 0, "finer"}, {`"1h"`, 3600000, ""}, {`"720h"`, 720 * 3600000, ""}, {`2592000`, 2592000000, ""},
		{`0`, 0, "not positive"}, {`-1`, 0, "not positive"}, {`"-1s"`, 0, "not positive"}, {`0.0001`, 0, "finer"},
		{`2592000.001`, 0, "out of range"}, {`"721h"`, 0, "out of range"}, {`1e300`, 0, "out of range"},
		{`"soon"`, 0, "not a duration"}, {`true`, 0, "neither"}, {`[]`, 0, "neither"},
	} {
		got, err := execTimeout(json.RawMessage(tt.raw))
		if got != tt.want || (err == nil) != (tt.err == "") || (err != nil && !strings.Contains(err.Error(), tt.err)) {
			t.Errorf("execTimeout(%s) = %d, %v; want %d, %q", tt.raw, got, err, tt.want, tt.err)
		}
		if err != nil && errdefs.KindOf(err) != errdefs.KindInvalid {
			t.Errorf("execTimeout(%s): kind %s", tt.raw, errdefs.KindOf(err))
		}
	}
}

// A framed exec body (docs/exec-stream.md) is checked as the JSON body is,
// and its first frame must be the request: each of these is refused before
// the server does anything.
func TestFramedExecRefusesBadInput(t *testing.T) {
	frame := func(typ byte, p string) string {
		n := len(p)
		return string([]byte{typ, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}) + p
	}
	tests := []struct {
		name, body string
		status     int
		want       string
	}{
		{"stdin first", frame('I', "x"), 400, "starts with a 'Q' frame"},
		{"empty body", "", 400, "read the request frame"},
		{"cut header", "Q\x00\x00", 400, "read the request frame"},
		{"cut payload", "Q\x00\x00\x00\x10{}", 400, "read the request frame"},
		{"stdin in the request", frame('Q', `{"argv":["cat"],"stdin":"eA=="}`), 400, `not in the request's "stdin"`},
		{"not JSON", frame('Q', `{argv`), 400, "not valid JSON"},
		{"unknown field", frame('Q', `{"argv":["cat"],"cmd":1}`), 400, "unknown field"},
		{"argv NUL", frame('Q', `{"argv":["a\u0000"]}`), 400, "NUL"},
		{"no argv", frame('Q', `{}`), 400, "no command"},
		{"request frame too big", "Q\x00\x20\x00\x00", 413, "larger than"},
	}
	s, _ := testServer(t)
	h := s.Handler()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/v0/sandboxes/x/exec", strings.NewReader(tt.body))
			r.Header.Set("Content-Type", StreamMediaType)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, admin(r))
			var got Error
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
				t.Fatalf("body %q is not the error JSON: %v", w.Body, err)
			}
			if w.Code != tt.status || !strings.Contains(got.Message, tt.want) {
				t.Fatalf("= %d %+v; want %d saying %q", w.Code, got, tt.status, tt.want)
			}
		})
	}
}

func TestAcceptsStream(t *testing.T) {
	tests := []struct {
		accept []string
		want   bool
	}{
		{nil, false},
		{[]string{"application/x-ndjson"}, false},
		{[]string{"application/vnd.shard.stream"}, true},
		{[]string{"application/json, Application/Vnd.Shard.Stream; q=0.9"}, true},
		{[]string{"text/plain", "application/vnd.shard.stream"}, true},
		{[]string{"application/vnd.shard.streamx"}, false},
	}
	for _, tt := range tests {
		r := httptest.NewRequest("POST", "/", nil)
		for _, a := range tt.accept {
			r.Header.Add("Accept", a)
		}
		if got := acceptsStream(r); got != tt.want {
			t.Errorf("acceptsStream(%q) = %v, want %v", tt.accept, got, tt.want)
		}
	}
}
