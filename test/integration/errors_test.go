package integration

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBadInput: each user mistake is a clear 4xx {"code","message"}, and
// leaves nothing behind.
func TestBadInput(t *testing.T) {
	e := need(t)
	running := create(t, mustCreate(busybox, "bad-input-running"))
	stopped := create(t, mustCreate(busybox, "bad-input-stopped"))
	if _, err := e.c.Stop(ctxT(t), stopped.ID); err != nil {
		t.Fatal(err)
	}
	before := sandboxFiles(t)
	hc := unixHTTP(e.socket)
	big := `{"image":"` + strings.Repeat("a", 2<<20) + `"}`
	tests := []struct {
		name, method, path, body string
		status                   int
		code, msg                string
	}{
		{"unknown image", "POST", "/v0/sandboxes", `{"image":"` + e.registry + `/nosuch:latest"}`, 404, "image_not_found", "not found"},
		{"unknown tag through the mirror", "POST", "/v0/sandboxes", `{"image":"busybox:nosuchtag"}`, 404, "image_not_found", "not found"},
		{"bad memory text", "POST", "/v0/sandboxes", `{"image":"busybox","memory":"lots"}`, 400, "invalid_argument", `"lots" is not a size`},
		{"memory too small", "POST", "/v0/sandboxes", `{"image":"busybox","memory":"1MiB"}`, 400, "invalid_argument", "too small"},
		{"bad cpu", "POST", "/v0/sandboxes", `{"image":"busybox","cpu":"fast"}`, 400, "invalid_argument", "cpu"},
		{"duplicate name", "POST", "/v0/sandboxes", `{"image":"busybox","name":"bad-input-running"}`, 409, "name_taken", "bad-input-running already exists"},
		{"bad name", "POST", "/v0/sandboxes", `{"image":"busybox","name":"no spaces"}`, 400, "invalid_argument", "not valid"},
		{"unknown provider", "POST", "/v0/sandboxes", `{"image":"busybox","provider":"qemu"}`, 400, "invalid_argument", "unknown provider"},
		{"unavailable provider", "POST", "/v0/sandboxes", `{"image":"busybox","provider":"firecracker"}`, 409, "unsupported", "not available on this host"},
		{"no image", "POST", "/v0/sandboxes", `{}`, 400, "invalid_argument", "image is required"},
		{"invalid json", "POST", "/v0/sandboxes", `{"image":`, 400, "invalid_argument", "not valid JSON"},
		{"unknown field", "POST", "/v0/sandboxes", `{"image":"busybox","colour":"red"}`, 400, "invalid_argument", "unknown field"},
		{"wrong type", "POST", "/v0/sandboxes", `{"image":42}`, 400, "invalid_argument", "image"},
		{"oversized body", "POST", "/v0/sandboxes", big, 413, "body_too_large", "larger than"},
		{"unknown sandbox", "GET", "/v0/sandboxes/nosuch", ``, 404, "sandbox_not_found", "nosuch not found"},
		{"exec unknown sandbox", "POST", "/v0/sandboxes/nosuch/exec", `{"argv":["true"]}`, 404, "sandbox_not_found", "not found"},
		{"exec on stopped", "POST", "/v0/sandboxes/bad-input-stopped/exec", `{"argv":["true"]}`, 409, "sandbox_not_running", "is stopped"},
		{"exec no argv", "POST", "/v0/sandboxes/bad-input-running/exec", `{"argv":[]}`, 400, "invalid_argument", "no command"},
		{"exec unknown command", "POST", "/v0/sandboxes/bad-input-running/exec", `{"argv":["nosuchcmd"]}`, 400, "command_not_found", "nosuchcmd"},
		{"exec bad timeout", "POST", "/v0/sandboxes/bad-input-running/exec", `{"argv":["true"],"timeout":"soon"}`, 400, "invalid_argument", "timeout"},
		{"exec unknown user", "POST", "/v0/sandboxes/bad-input-running/exec", `{"argv":["true"],"user":"ghost"}`, 400, "invalid_argument", "ghost"},
		{"exec bad workdir", "POST", "/v0/sandboxes/bad-input-running/exec", `{"argv":["true"],"workdir":"/nope"}`, 400, "invalid_argument", "/nope"},
		{"stop stopped", "POST", "/v0/sandboxes/bad-input-stopped/stop", ``, 409, "sandbox_not_running", "not running"},
		{"start running", "POST", "/v0/sandboxes/bad-input-running/start", ``, 409, "sandbox_running", "already running"},
		{"remove running", "DELETE", "/v0/sandboxes/bad-input-running", ``, 409, "sandbox_running", "--force"},
		{"bad force", "DELETE", "/v0/sandboxes/bad-input-running?force=maybe", ``, 400, "invalid_argument", "force"},
		{"unknown endpoint", "GET", "/v0/nothing", ``, 404, "not_found", "no such endpoint"},
		{"unknown image rm", "DELETE", "/v0/images/nosuch:latest", ``, 404, "image_not_found", "nosuch"},
		{"image in use", "DELETE", "/v0/images/busybox", ``, 409, "image_in_use", "bad-input"},
		{"bad reference", "POST", "/v0/sandboxes", `{"image":"UPPER/Case::x"}`, 400, "invalid_argument", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, "http://shard"+tt.path, strings.NewReader(tt.body))
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			var got struct{ Code, Message string }
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatalf("body is not the error JSON: %q", b)
			}
			if resp.StatusCode != tt.status || got.Code != tt.code || !strings.Contains(got.Message, tt.msg) {
				t.Fatalf("got %d %s %q; want %d %s containing %q", resp.StatusCode, got.Code, got.Message, tt.status, tt.code, tt.msg)
			}
		})
	}
	// The CLI prints the message and exits non-zero.
	_, errOut, code := e.cli(t, "", "create", "--memory", "lots", "busybox")
	if code == 0 || !strings.Contains(errOut, `"lots" is not a size`) {
		t.Errorf("cli bad --memory: code %d, %q", code, errOut)
	}
	_, errOut, code = e.cli(t, "", "exec", "bad-input-running", "nosuchcmd")
	if code != 127 || !strings.Contains(errOut, "nosuchcmd") {
		t.Errorf("cli unknown command: code %d, %q; want 127", code, errOut)
	}
	// Nothing was left behind by any failed request.
	all, err := e.c.List(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range all {
		if sb.ID != running.ID && sb.ID != stopped.ID && strings.HasPrefix(sb.Name, "bad-input") {
			t.Errorf("left behind: %+v", sb)
		}
		if sb.State != "running" && sb.State != "stopped" {
			t.Errorf("sandbox %s in state %s after bad requests", sb.Name, sb.State)
		}
	}
	if after := sandboxFiles(t); after != before {
		t.Errorf("files of sandboxes changed across failed requests:\nbefore %s\nafter  %s", before, after)
	}
}

func sandboxFiles(t *testing.T) string {
	e := need(t)
	var names []string
	for _, d := range []string{filepath.Join(e.dataDir, "storage", "sandboxes"), filepath.Join(e.dataDir, "run"), filepath.Join(e.runDir, "netns")} {
		ents, _ := os.ReadDir(d)
		for _, en := range ents {
			names = append(names, en.Name())
		}
	}
	return strings.Join(names, " ")
}

func unixHTTP(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
}
