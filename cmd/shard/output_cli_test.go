package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/useshards/shard/client"
)

// fakeServer answers the CLI on a Unix socket with canned JSON per path.
func fakeServer(t *testing.T, answers map[string]any) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, ok := answers[r.URL.Path]
		if !ok {
			w.WriteHeader(404)
			json.NewEncoder(w).Encode(client.Error{Code: "not_found", Message: "no " + r.URL.Path})
			return
		}
		json.NewEncoder(w).Encode(v)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// runCLI runs the CLI with args and returns what it printed on stdout.
func runCLI(t *testing.T, args ...string) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	done := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		done <- string(b)
	}()
	cmd := newRoot()
	cmd.SetArgs(args)
	err = cmd.Execute()
	os.Stdout = old
	w.Close()
	out := <-done
	if err != nil {
		t.Fatalf("shard %v: %v", args, err)
	}
	return out
}

// TestCLIEscapesServerText: what a server answers (a tag, a name, an
// environment value, all of which a key or an image controls) reaches the
// terminal escaped: no ESC sequence, no forged table row or field; --json
// stays exact.
func TestCLIEscapesServerText(t *testing.T) {
	evil := "v1\x1b[31m\nck-forged  fork  owned\u202e"
	sock := fakeServer(t, map[string]any{
		"/v0/sandboxes/sb/checkpoints": map[string]any{"checkpoints": []client.Checkpoint{{ID: "ck1", Kind: "checkpoint", Tag: evil, SandboxName: "sb", Session: "sb"}}},
		"/v0/sandboxes/sb": client.Sandbox{ID: "0123456789ab", Name: "sb", State: "running",
			Env: []string{"PS1=\x1b]0;pwned\x07", "X=a\nForged:\tb"}, Error: "died\x1b[2J"},
	})
	for _, tc := range []struct {
		name  string
		args  []string
		lines int      // lines printed
		want  []string // escaped text
	}{
		{"checkpoint ls", []string{"checkpoint", "ls", "sb"}, 2, []string{`v1\x1b[31m\nck-forged  fork  owned\u202e`}},
		{"inspect", []string{"inspect", "sb"}, 0, []string{`PS1=\x1b]0;pwned\x07`, `X=a\nForged:\tb`, `died\x1b[2J`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := runCLI(t, append([]string{"--socket", sock}, tc.args...)...)
			if strings.ContainsFunc(out, func(r rune) bool { return r == 0x1b || r == 0x07 || r == '\u202e' }) {
				t.Errorf("raw control characters in:\n%q", out)
			}
			if n := strings.Count(out, "\n"); tc.lines > 0 && n != tc.lines {
				t.Errorf("%d lines, want %d:\n%s", n, tc.lines, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("no %q in:\n%s", w, out)
				}
			}
			if strings.Contains(out, "\nForged:") {
				t.Errorf("a forged inspect field:\n%s", out)
			}
		})
	}
	out := runCLI(t, "--socket", sock, "checkpoint", "ls", "--json", "sb")
	var cks []client.Checkpoint
	if err := json.Unmarshal([]byte(out), &cks); err != nil || len(cks) != 1 || cks[0].Tag != evil {
		t.Errorf("--json: %v, %+v; want the tag exactly", err, cks)
	}
}
