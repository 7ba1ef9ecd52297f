package integration

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/useshards/shard/internal/auth"
)

// sdkEnv is what the SDKs' own test suites get: the server over TCP with a
// key of every scope, the local images that stand in for python:3.12-slim
// and node:22, and the package index that stands in for PyPI.
func sdkEnv(t *testing.T) []string {
	t.Helper()
	e := need(t)
	index := startPackageIndex(t)
	key := token(t, "sdk-tests", auth.All)
	return append(os.Environ(),
		"SHARD_INTEGRATION=1",
		"SHARD_REMOTE=http://"+e.tcp,
		"SHARD_API_KEY="+key,
		"SHARD_TEST_PYTHON_IMAGE="+python,
		"SHARD_TEST_NODE_IMAGE=node:22",
		"SHARD_TEST_PIP_INDEX="+index,
	)
}

// runSuite runs a command in dir with env, logging its output, and fails
// the test if it fails.
func runSuite(t *testing.T, dir string, env []string, timeout time.Duration, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("%s %v in %s:\n%s", name, args, dir, out.String())
	if err != nil {
		t.Fatalf("%s %v: %v", name, args, err)
	}
}

// TestSDKTypeScript runs the TypeScript SDK's tests — its unit tests and
// every seed example — against this server.
func TestSDKTypeScript(t *testing.T) {
	e := need(t)
	env := sdkEnv(t)
	dir := filepath.Join(e.root, "sdk", "typescript")
	runSuite(t, dir, env, 5*time.Minute, "npm", "ci", "--no-audit", "--no-fund")
	runSuite(t, dir, env, 5*time.Minute, "npm", "run", "build")
	runSuite(t, dir, env, 20*time.Minute, "npm", "test")
}

// TestSDKPython runs the Python SDK's tests (Debian's python3, standard
// library only) — unit tests and the seed examples — against this server.
func TestSDKPython(t *testing.T) {
	e := need(t)
	env := sdkEnv(t)
	runSuite(t, filepath.Join(e.root, "sdk", "python"), env, 20*time.Minute, "/usr/bin/python3", "-m", "unittest", "discover", "-s", "tests", "-v")
}
