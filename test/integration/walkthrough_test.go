package integration

import (
	"strings"
	"testing"
)

// TestSeedWalkthrough runs the CLI walk-through of seed 001 ("How to fork a
// sandbox to try two paths?") as written, with two offline changes: the
// python:3.12-slim image comes from the local registry (as a docker.io
// mirror, so the name is the seed's), and instead of pip installing a
// version from PyPI each step writes the version it would have installed.
func TestSeedWalkthrough(t *testing.T) {
	e := need(t)
	step := func(want int, args ...string) string {
		t.Helper()
		out, errOut, code := e.cli(t, "", args...)
		if code != want {
			t.Fatalf("shard %s: exit %d, want %d\nstdout %s\nstderr %s", strings.Join(args, " "), code, want, out, errOut)
		}
		return out
	}
	for _, n := range []string{"base", "try-a", "try-b"} {
		e.cli(t, "", "remove", "--force", n)
	}
	t.Cleanup(func() {
		for _, n := range []string{"base", "try-a", "try-b"} {
			e.cli(t, "", "remove", "--force", n)
		}
	})
	pipInstall := func(sb, version string) []string {
		// What `pip install requests==VERSION` leaves behind, minus PyPI.
		return []string{"exec", sb, "sh", "-c", "mkdir -p /usr/local/lib/site && printf '__version__ = \"" + version + "\"\\n' > /usr/local/lib/site/requests.py"}
	}
	check := []string{"python", "-c", "import sys; sys.path.insert(0, '/usr/local/lib/site'); import requests; print(requests.__version__)"}

	id := strings.TrimSpace(step(0, "create", "--name", "base", "--memory", "512MiB", "python:3.12-slim"))
	if len(id) != 12 {
		t.Fatalf("create printed %q", id)
	}
	step(0, pipInstall("base", "2.32.3")...)
	forkA := strings.TrimSpace(step(0, "fork", "--name", "try-a", "base"))
	forkB := strings.TrimSpace(step(0, "fork", "--name", "try-b", "base"))
	if len(forkA) != 12 || len(forkB) != 12 || forkA == forkB || forkA == id {
		t.Fatalf("fork printed %q and %q", forkA, forkB)
	}
	step(0, pipInstall("try-a", "2.31.0")...)
	step(0, pipInstall("try-b", "2.32.4")...)
	if got := step(0, append([]string{"exec", "try-a"}, check...)...); got != "2.31.0\n" {
		t.Errorf("try-a: %q", got)
	}
	if got := step(0, append([]string{"exec", "try-b"}, check...)...); got != "2.32.4\n" {
		t.Errorf("try-b: %q", got)
	}
	if got := step(0, append([]string{"exec", "base"}, check...)...); got != "2.32.3\n" {
		t.Errorf("base changed by a fork: %q", got)
	}
	// "If you do not pass --name, use that id to refer to the fork."
	anon := strings.TrimSpace(step(0, "fork", "base"))
	if got := step(0, append([]string{"exec", anon}, check...)...); got != "2.32.3\n" {
		t.Errorf("unnamed fork by id: %q", got)
	}
	step(0, "remove", "--force", anon)
	step(0, "remove", "--force", "try-a")
	step(1, "inspect", "try-a")
	step(0, "inspect", "try-b")
}
