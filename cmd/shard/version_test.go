package main

import (
	"io"
	"os"
	"strings"
	"testing"

	"github.com/useshards/shard/client"
)

func TestVersionShowsBoth(t *testing.T) {
	sock := fakeServer(t, map[string]any{"/v0/version": client.Version{Version: "abc1234", API: "v0"}})
	out := runCLI(t, "--socket", sock, "version")
	if !strings.Contains(out, "client:  "+version) || !strings.Contains(out, "server:  abc1234 (API v0)") {
		t.Fatalf("shard version printed %q", out)
	}
}

// A key exported for a remote server in a shell without SHARD_REMOTE goes
// unused: the CLI says so instead of acting as the socket's administrator
// silently.
func TestKeyWithoutRemoteWarns(t *testing.T) {
	sock := fakeServer(t, map[string]any{"/v0/version": client.Version{Version: "x", API: "v0"}})
	for _, tc := range []struct {
		key, remote string
		warn        bool
	}{
		{"shk_x", "", true},
		{"", "", false},
	} {
		t.Setenv("SHARD_API_KEY", tc.key)
		t.Setenv("SHARD_REMOTE", tc.remote)
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		old := os.Stderr
		os.Stderr = w
		runCLI(t, "--socket", sock, "version")
		os.Stderr = old
		w.Close()
		b, _ := io.ReadAll(r)
		if got := strings.Contains(string(b), "SHARD_API_KEY is set but SHARD_REMOTE is not"); got != tc.warn {
			t.Errorf("key %q remote %q: warned %v, want %v (stderr %q)", tc.key, tc.remote, got, tc.warn, b)
		}
	}
}
