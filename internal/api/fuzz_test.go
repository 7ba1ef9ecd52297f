package api

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/names"
	"github.com/useshards/shard/internal/sandbox"
)

// The fuzz targets feed request bodies to the parse functions the handlers
// run (decode and every check that needs no state). Whatever the body,
// nothing panics, and a refusal is a 4xx errdefs kind with a UTF-8
// message, never a 500; what is accepted holds the ranges the checks
// promise. Seed bodies are in testdata/fuzz/<FuzzName>.

var fuzzLimits = sandbox.Limits{MemoryBytes: 16 << 30, MemoryFrom: "fuzz", CPUMillis: 8000}

func fuzzRequest(method, path string, body []byte) *http.Request {
	return httptest.NewRequest(method, path, bytes.NewReader(body))
}

// refusal fails t unless err is nil or a user's error (4xx).
func refusal(t *testing.T, what string, body []byte, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if st := statusOf(errdefs.KindOf(err)); st < 400 || st >= 500 {
		t.Fatalf("%s(%q) = %v: status %d, want a 4xx", what, body, err, st)
	}
	if !utf8.ValidString(err.Error()) {
		t.Fatalf("%s(%q): message %q is not UTF-8", what, body, err)
	}
}

func addSeeds(f *testing.F, seeds ...string) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
}

func FuzzCreateRequest(f *testing.F) {
	addSeeds(f, `{"image":"busybox"}`, `{"image":"busybox","memory":"512MiB","cpu":0.5,"disk":"1GiB","pids":100,"env":{"A":"1"}}`,
		`{"image":"busybox","pids":9223372036854775807}`, `{"image":"busybox","memory_mib":17592186044928}`, `{"image":"busybox","cpu":"0.0001"}`,
		`{"environment":"e","name":"n"}`, `{"from_snapshot":"s","env":["A=1"],"memory":1e9}`, `{"image":"b","cpu":1e-4,"disk":"8191PiB"}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		req, cr, err := parseCreate(fuzzRequest("POST", "/v0/sandboxes", body), fuzzLimits)
		refusal(t, "parseCreate", body, err)
		if err != nil || req.Environment != "" {
			return
		}
		if err := sandbox.CheckCreate(cr, fuzzLimits); err != nil {
			t.Fatalf("parseCreate(%q) passed %+v, which CheckCreate refuses: %v", body, cr, err)
		}
		switch {
		case cr.MemoryBytes < 0 || cr.MemoryBytes > fuzzLimits.MemoryBytes,
			cr.CPUMillis < 0 || cr.CPUMillis > fuzzLimits.CPUMillis,
			cr.DiskBytes < 0 || cr.DiskBytes > sandbox.MaxDisk,
			cr.Pids < 0 || cr.Pids > sandbox.MaxPids:
			t.Fatalf("parseCreate(%q) passed bounds out of range: %+v", body, cr)
		}
	})
}

// FuzzForkRequest also runs the other small bodies that name or tag what a
// sandbox is saved as: checkpoint, restore, resume, snapshot.
func FuzzForkRequest(f *testing.F) {
	addSeeds(f, `{}`, `{"name":"try","count":3,"tag":"t1"}`, `{"count":65}`, `{"count":-1}`, `{"tag":"a/b"}`,
		`{"name":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","count":64}`, `{"sandbox":"x","name":".."}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		fr, err := parseFork(fuzzRequest("POST", "/v0/sandboxes/x/fork", body))
		refusal(t, "parseFork", body, err)
		if err == nil {
			if fr.Count < 1 || fr.Count > sandbox.MaxForkCount || names.Tag(fr.Tag) != nil {
				t.Fatalf("parseFork(%q) passed %+v", body, fr)
			}
		}
		tag, err := parseCheckpoint(fuzzRequest("POST", "/v0/sandboxes/x/checkpoints", body))
		refusal(t, "parseCheckpoint", body, err)
		if err == nil && strings.ContainsAny(tag, "/\x00") {
			t.Fatalf("parseCheckpoint(%q) passed tag %q", body, tag)
		}
		name, err := parseNewName(fuzzRequest("POST", "/v0/checkpoints/x/restore", body))
		refusal(t, "parseNewName", body, err)
		if err == nil && (len(name) > 63 || strings.ContainsAny(name, "/\x00")) {
			t.Fatalf("parseNewName(%q) passed name %q", body, name)
		}
		_, err = parseSnapshot(fuzzRequest("POST", "/v0/snapshots", body))
		refusal(t, "parseSnapshot", body, err)
	})
}

func FuzzExecRequest(f *testing.F) {
	addSeeds(f, `{"argv":["true"]}`, `{"argv":["sh","-c","echo"],"env":{"A":"1"},"workdir":"/tmp","user":"nobody","timeout":"30s","stdin":"aGk="}`,
		`{"argv":["true"],"timeout":0.0001}`, `{"argv":["true"],"timeout":1e300}`, `{"argv":["a\u0000"]}`, `{"argv":[],"tty":true,"rows":70000}`,
		`{"argv":["x"],"env":["A=1","B"]}`, `{"argv":["x"],"stdin":"!!"}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		ar, stdin, err := parseExec(fuzzRequest("POST", "/v0/sandboxes/x/exec", body))
		refusal(t, "parseExec", body, err)
		if err != nil {
			return
		}
		if len(ar.Argv) == 0 || ar.Timeout < 0 || ar.Timeout > MaxExecTimeout || (stdin != nil) != ar.Stdin {
			t.Fatalf("parseExec(%q) passed %+v", body, ar)
		}
		for _, s := range append(append(ar.Argv, ar.Env...), ar.Workdir, ar.User) {
			if strings.Contains(s, "\x00") {
				t.Fatalf("parseExec(%q) passed a NUL", body)
			}
		}
	})
}

func FuzzEnvironmentRequest(f *testing.F) {
	addSeeds(f, `{"name":"py","image":"python:3.12-slim","memory":"1GiB","setup":[["pip","install","x"]]}`, `{"name":"e","sandbox":"sb","fingerprint":"py-abc"}`,
		`{"name":"../x","image":"b"}`, `{"name":"e","image":"b","cpu":"0.0001"}`, `{"name":"e","image":"b","setup":[[]]}`, `{"name":"e","image":"b","memory_mib":17592186044928}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		er, err := parseEnvironment(fuzzRequest("POST", "/v0/environments", body), fuzzLimits)
		refusal(t, "parseEnvironment", body, err)
		if err != nil {
			return
		}
		if names.Name("environment", er.Name) != nil {
			t.Fatalf("parseEnvironment(%q) passed name %q", body, er.Name)
		}
		if er.Sandbox == "" {
			if err := sandbox.CheckCreate(er.Create, fuzzLimits); err != nil {
				t.Fatalf("parseEnvironment(%q) passed %+v: %v", body, er.Create, err)
			}
		}
		for _, argv := range er.Setup {
			if len(argv) == 0 {
				t.Fatalf("parseEnvironment(%q) passed an empty setup command", body)
			}
		}
	})
}

func FuzzGrantRequest(f *testing.F) {
	addSeeds(f, `{"secret":"GH_TOKEN"}`, `{"secret":"gh","env":"GH_TOKEN"}`, `{"secret":"tls.key","file":"/etc/app/tls.key"}`,
		`{"secret":"s","file":"/etc/../x"}`, `{"secret":"s","env":"A=B"}`, `{"secret":"s","env":"A","file":"/x"}`, `{"secret":"s","at":"2020-01-01T00:00:00Z"}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		g, err := parseGrant(fuzzRequest("POST", "/v0/sandboxes/x/grants", body))
		refusal(t, "parseGrant", body, err)
		if err != nil {
			return
		}
		// A grant named after its secret is checked by the service, once
		// it found the secret (an unknown one is a 404 whatever its name).
		switch {
		case g.File != "" && names.FilePath("file", g.File) != nil,
			g.File == "" && g.Env != "" && names.EnvName(g.Env) != nil,
			g.File != "" && g.Env != "":
			t.Fatalf("parseGrant(%q) passed %+v", body, g)
		}
	})
}

func FuzzPolicyRequest(f *testing.F) {
	addSeeds(f, `{}`, `{"deny_all":true,"allow":["pypi.org","*.example.org","10.0.0.0/8"]}`, `{"deny":["169.254.169.254"]}`,
		`{"allow":["not an address!"]}`, `{"allow":["1.2.3.4/33"]}`, `{"deny":[""]}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		_, err := parsePolicy(fuzzRequest("PUT", "/v0/sandboxes/x/policy", body))
		refusal(t, "parsePolicy", body, err)
	})
}

func FuzzTokenRequest(f *testing.F) {
	addSeeds(f, `{"name":"ci","scopes":["sandbox:read","sandbox:write"]}`, `{"name":"t","scopes":["*"]}`, `{"name":"../t","scopes":["*"]}`,
		`{"name":"t","scopes":[]}`, `{"name":"t","scopes":["root"]}`, `{"name":"0123456789ab","scopes":["*"]}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := parseToken(fuzzRequest("POST", "/v0/tokens", body))
		refusal(t, "parseToken", body, err)
		if err == nil && (len(req.Scopes) == 0 || names.Name("token", req.Name) != nil) {
			t.Fatalf("parseToken(%q) passed %+v", body, req)
		}
	})
}

func FuzzSecretRequest(f *testing.F) {
	f.Add("OPENAI_API_KEY", []byte(`{"value":"c2VjcmV0"}`))
	f.Add("tls.key", []byte(`{"value":""}`))
	f.Add("..", []byte(`{"value":"eA=="}`))
	f.Add("s", []byte(`{"value":"!!"}`))
	f.Add("s", []byte(`{"value":null}`))
	f.Fuzz(func(t *testing.T, name string, body []byte) {
		r := fuzzRequest("PUT", "/v0/secrets/x", body)
		r.SetPathValue("name", name)
		n, v, err := parseSecret(r)
		refusal(t, "parseSecret", body, err)
		if err == nil && (len(v) == 0 || n != name || strings.ContainsAny(n, "/\x00")) {
			t.Fatalf("parseSecret(%q, %q) passed %q, %d bytes", name, body, n, len(v))
		}
	})
}
