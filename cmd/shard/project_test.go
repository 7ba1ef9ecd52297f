package main

import (
	"io"
	"os"
	"strings"
	"testing"

	"github.com/useshards/shard/client"
)

// TestListWarnsOfAnEmptyProject: a mistyped --project acts in a project of
// its own, so `shard ls` says on stderr when the project it names holds
// nothing, and stays quiet for one that does and when none is named.
func TestListWarnsOfAnEmptyProject(t *testing.T) {
	t.Setenv("SHARD_PROJECT", "")
	sock := fakeServer(t, map[string]any{
		"/v0/sandboxes": map[string]any{"sandboxes": []client.Sandbox{}},
		"/v0/projects":  map[string]any{"projects": []client.Project{{Name: "team-a", Secrets: 1}}},
	})
	for _, tc := range []struct {
		args []string
		warn bool
	}{
		{[]string{"--project", "tema-a", "ls"}, true},
		{[]string{"--project", "team-a", "ls"}, false},
		{[]string{"ls"}, false},
	} {
		stderr := captureStderr(t, func() { runCLI(t, append([]string{"--socket", sock}, tc.args...)...) })
		if got := strings.Contains(stderr, "holds nothing yet"); got != tc.warn {
			t.Errorf("shard %v: stderr %q, want a warning: %v", tc.args, stderr, tc.warn)
		}
	}
}

func captureStderr(t *testing.T, fn func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = w
	done := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		done <- string(b)
	}()
	fn()
	os.Stderr = old
	w.Close()
	return <-done
}
