// Package testenv holds the rules tests share about what the machine must
// have. Plain `go test ./...` anywhere skips what needs root; the README's
// test command and CI set SHARD_INTEGRATION=1, and there a test that cannot
// run fails instead: a skipped test proves nothing.
package testenv

import (
	"os"
	"testing"
)

// Strict reports whether missing prerequisites must fail tests.
func Strict() bool { return os.Getenv("SHARD_INTEGRATION") == "1" }

// RequireRoot skips t when not root, or fails it in strict runs.
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if Strict() {
		t.Fatalf("needs root (%s), and SHARD_INTEGRATION=1 says this run must have it", why)
	}
	t.Skipf("needs root (%s); run as root with SHARD_INTEGRATION=1", why)
}
