package integration

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/auth"
)

// sdkEnv is what the SDKs' own test suites get: sdkServerEnv, the local
// images that stand in for python:3.12-slim and node:22, and the package
// index that stands in for PyPI.
func sdkEnv(t *testing.T) []string {
	t.Helper()
	index := startPackageIndex(t)
	return append(sdkServerEnv(t),
		"SHARD_TEST_PYTHON_IMAGE="+python,
		"SHARD_TEST_NODE_IMAGE=node:22",
		"SHARD_TEST_PIP_INDEX="+index,
	)
}

// sdkServerEnv is the server over TCP with a key of every scope (of the
// default project) and a key of another project, which must not see the
// SDK tests' sandboxes.
func sdkServerEnv(t *testing.T) []string {
	t.Helper()
	e := need(t)
	key := token(t, "sdk-tests", auth.All)
	other, err := e.c.CreateToken(ctxT(t), client.TokenRequest{Name: "sdk-tests-other", Scopes: []string{auth.All}, Project: "sdk-other"})
	if err != nil {
		t.Fatalf("token of project sdk-other: %v", err)
	}
	t.Cleanup(func() { e.c.RevokeToken(context.Background(), other.ID) })
	return append(os.Environ(),
		"SHARD_INTEGRATION=1",
		"SHARD_REMOTE=http://"+e.tcp,
		"SHARD_API_KEY="+key,
		"SHARD_TEST_OTHER_PROJECT_KEY="+other.Key,
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
		t.Fatalf("%s %v: %v%s", name, args, err, failedParts(out.String()))
	}
}

// failedParts is what of a suite's output says what failed (a TAP "not ok"
// and the lines after it, a Python unittest FAIL: or ERROR: block), so
// that it stands at the end of a log that is read only in part.
func failedParts(out string) string {
	var b strings.Builder
	lines := strings.Split(out, "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(l, "not ok") && !strings.HasPrefix(l, "FAIL:") && !strings.HasPrefix(l, "ERROR:") {
			continue
		}
		b.WriteString("\n" + lines[i])
		for j := i + 1; j < len(lines) && j <= i+40; j++ {
			n := strings.TrimSpace(lines[j])
			if strings.HasPrefix(n, "ok ") || strings.HasPrefix(n, "# Subtest") || strings.HasPrefix(n, "not ok") || strings.HasPrefix(n, "FAIL:") || strings.HasPrefix(n, "ERROR:") {
				break
			}
			b.WriteString("\n" + lines[j])
		}
		if b.Len() > 20000 {
			break
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return "\nwhat failed:" + b.String()
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

// TestSDKProjects runs only the SDKs' project checks (a key of another
// project gets 404 for their sandbox, 403 naming theirs), which
// TestSDKPython and TestSDKTypeScript run too, among the rest.
func TestSDKProjects(t *testing.T) {
	e := need(t)
	env := append(sdkServerEnv(t), "SHARD_TEST_PYTHON_IMAGE="+python) // no package index: they install nothing
	runSuite(t, filepath.Join(e.root, "sdk", "python"), env, 5*time.Minute,
		"/usr/bin/python3", "-m", "unittest", "discover", "-s", "tests", "-p", "test_integration.py", "-k", "ProjectTest", "-v")
	dir := filepath.Join(e.root, "sdk", "typescript")
	runSuite(t, dir, env, 5*time.Minute, "npm", "ci", "--no-audit", "--no-fund")
	runSuite(t, dir, env, 5*time.Minute, "npm", "run", "pretest")
	runSuite(t, dir, env, 5*time.Minute, "node", "--test", "dist-test/projects.integration.test.js")
}

// TestSDKInstallFromCheckout: scripts/sdk-install.sh installs each SDK into
// a project of its own, from a fresh directory, leaving the checkout as it
// was (ignored files too: the documented `npm pack` in the checkout left a
// .tgz there, and a build its dist/ and node_modules/); the project then
// reaches this server with it.
func TestSDKInstallFromCheckout(t *testing.T) {
	e := need(t)
	env := sdkServerEnv(t)
	status := func() string {
		out, err := exec.Command("git", "-C", e.root, "status", "--porcelain", "--ignored", "--", "sdk").CombinedOutput()
		if err != nil {
			t.Fatalf("git status: %v\n%s", err, out)
		}
		return string(out)
	}
	script := filepath.Join(e.root, "scripts", "sdk-install.sh")
	for _, tc := range []struct {
		kind  string
		check []string // run in the project: it lists the sandboxes through the SDK
	}{
		{"ts", []string{"node", "--input-type=module", "-e",
			`import { Shard } from "useshards"; const s = new Shard(); console.log("sandboxes:", (await s.list()).length); s.close();`}},
		{"python", []string{".venv/bin/python", "-c",
			`from useshards import Shard; s = Shard(); print("sandboxes:", len(s.list())); s.close()`}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			project := t.TempDir()
			before := status()
			runSuite(t, project, env, 5*time.Minute, script, tc.kind, project)
			if after := status(); after != before {
				t.Errorf("the checkout changed under sdk/:\nbefore:\n%s\nafter:\n%s", before, after)
			}
			runSuite(t, project, env, time.Minute, tc.check[0], tc.check[1:]...)
		})
	}
}

// TestFailedParts: a suite's failures are picked out of its output, each
// with the lines that say why, and nothing when all passed.
func TestFailedParts(t *testing.T) {
	for _, tc := range []struct{ name, out, want string }{
		{"all passed", "ok 1 - a\nok 2 - b\n", ""},
		{"TAP", "# Subtest: a\nok 1 - a\n# Subtest: b\nnot ok 2 - b\n  ---\n  error: 'boom'\n  ...\n# Subtest: c\nok 3 - c\n",
			"\nwhat failed:\nnot ok 2 - b\n  ---\n  error: 'boom'\n  ..."},
		{"unittest", "test_a ... ok\n======\nERROR: test_b (x.T)\n------\nTypeError: nope\n\n", "\nwhat failed:\nERROR: test_b (x.T)\n------\nTypeError: nope\n\n"},
	} {
		if got := failedParts(tc.out); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
