package integration

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDocsShapeRules: what checkDocBlock lets through and what it refuses,
// without a server: run-by names a test of test/integration or a script
// under scripts/ or .ci/ that runs a command of the block, and a block run
// here reaches the test's server and projects only.
func TestDocsShapeRules(t *testing.T) {
	root := t.TempDir()
	for path, text := range map[string]string{
		"go.mod":                  "module x\n",
		"scripts/test.sh":         "#!/bin/sh\ngo test ./...\n",
		"scripts/other.sh":        "#!/bin/sh\necho hi\n",
		".ci/run":                 "#!/bin/sh\nexec scripts/test.sh\n",
		"scripts/sub/bench.sh":    "#!/bin/sh\nshard create x\n",
		"test/integration/x_test": "",
	} {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(root, "scripts/link.sh")); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{"TestCluster": true, "BenchmarkBoundary": true}
	tests := []struct {
		name, runBy, body string
		want              string // part of the error; "" for none
	}{
		{"a test", "TestCluster", "shard serve --listen x\n", ""},
		{"a benchmark", "BenchmarkBoundary", "go test -bench .\n", ""},
		{"no such test", "TestNope", "true\n", "name a Test or Benchmark"},
		{"a script running the block's command", "scripts/test.sh", "SHARD_INTEGRATION=1 go test ./test/integration   # all\n", ""},
		{"a script running a later command", ".ci/run", "scripts/install-deps.sh && scripts/demo.sh   # 1.\nscripts/test.sh   # 2.\n", ""},
		{"a script in a directory", "scripts/sub/bench.sh", "shard create y\n", ""},
		{"a script running none of them", "scripts/other.sh", "go test ./...\n", "runs none of the block's commands (go test)"},
		{"a file of the repository", "go.mod", "go build\n", "name a Test or Benchmark"},
		{"a path out of it", "../../etc/passwd", "cat\n", "name a Test or Benchmark"},
		{"out through scripts", "scripts/../go.mod", "go build\n", "name a Test or Benchmark"},
		{"out through .ci", ".ci/../../etc/passwd", "root\n", "name a Test or Benchmark"},
		{"a directory", "scripts/sub", "shard create y\n", "no such test"},
		{"a link", "scripts/link.sh", "root\n", "no such test"},
		{"no such script", "scripts/nope.sh", "true\n", "no such test"},
		{"a plain block", "", "shard create --name box busybox\nshard --project team-a ls\n", ""},
		{"a comment saying serve", "", "shard ls   # the server, not shard server\n", ""},
		{"reading SHARD_REMOTE", "", `curl "$SHARD_REMOTE/v0/version"` + "\n", ""},
		{"another key", "", "SHARD_API_KEY=$key shard whoami\n", ""},
		{"--socket", "", "shard --socket /run/shard/shard.sock ls\n", "names a Unix socket"},
		{"curl on the socket", "", "curl --unix-socket /run/x http://x/v0/version\n", "names a Unix socket"},
		{"the socket's path", "", "ls -l /run/shard/shard.sock\n", "names a Unix socket"},
		{"SHARD_REMOTE set", "", "SHARD_REMOTE= shard ls\n", "sets SHARD_REMOTE"},
		{"SHARD_REMOTE exported", "", "export SHARD_REMOTE=http://10.0.0.5:7070\n", "sets SHARD_REMOTE"},
		{"SHARD_REMOTE unset", "", "unset SHARD_REMOTE\nshard ls\n", "unsets SHARD_REMOTE"},
		{"SHARD_REMOTE unset among others", "", "unset -v FOO SHARD_REMOTE; shard ls\n", "unsets SHARD_REMOTE"},
		{"SHARD_PROJECT set", "", "SHARD_PROJECT=default shard rm -f x\n", "sets SHARD_REMOTE or SHARD_PROJECT"},
		{"env -u", "", "env -u SHARD_REMOTE shard ls\n", "env with options"},
		{"env -i", "", "env -i PATH=$PATH shard ls\n", "env with options"},
		{"shard serve", "", "shard serve --listen 127.0.0.1:7070 &\n", "starts shard serve"},
		{"sudo", "", "sudo shard ls\n", "runs sudo"},
		{"--project default", "", "shard --project default ls\n", "never default"},
		{"--project=default", "", "shard ls --project=default\n", "never default"},
		{"a project not literal", "", `shard --project "$p" ls` + "\n", "name the project literally"},
		{"every project", "", "shard --project '*' ls\n", "name the project literally"},
		{"--project last", "", "shard ls --project\n", "name the project literally"},
		{"a project of its own", "", "shard --project=team-b ls\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkDocBlock(root, names, docBlock{file: "doc.md", line: 1, runBy: tt.runBy, body: tt.body})
			if tt.want == "" {
				if err != nil {
					t.Fatalf("checkDocBlock(run-by=%q, %q) = %v, want it let through", tt.runBy, tt.body, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("checkDocBlock(run-by=%q, %q) = %v, want an error with %q", tt.runBy, tt.body, err, tt.want)
			}
		})
	}
}

// TestDocsShapeRunBlock: whatever a block leaves in the background is
// killed once it ends, in every mode, and does not keep its output open
// (a default block's output was read until every holder had gone:
// forever); a block still running at the timeout is killed whole.
func TestDocsShapeRunBlock(t *testing.T) {
	tests := []struct {
		name, mode, body string
		timeout          time.Duration
		wantErr          string // part of the error; "" for none
	}{
		{name: "default", body: "sleep 300 & echo $! > pids; echo done\n", timeout: time.Minute},
		{name: "default, output closed", body: "sleep 300 >/dev/null 2>&1 & echo $! > pids; echo done\n", timeout: time.Minute},
		{name: "tty", mode: "tty", body: "sleep 300 & echo $! > pids; echo done\n", timeout: time.Minute},
		{name: "interrupt", mode: "interrupt", body: "sleep 300 & echo $! > pids; echo done; sleep 300 & echo $! >> pids; wait\n", timeout: time.Minute},
		{name: "timeout", body: "sleep 300 & echo $! > pids; echo done; sleep 301 & echo $! >> pids; wait\n", timeout: 2 * time.Second, wantErr: "still running at the timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), tt.timeout)
			defer cancel()
			start := time.Now()
			out, err := runDocBlock(ctx, docBlock{mode: tt.mode, body: tt.body}, dir, os.Environ())
			if took := time.Since(start); took > 30*time.Second {
				t.Errorf("the block took %s", took)
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("runDocBlock: %v\n%s", err, out)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("runDocBlock = %v, want an error with %q", err, tt.wantErr)
			}
			if !strings.Contains(string(out), "done") {
				t.Errorf("output %q, want what the block printed", out)
			}
			b, err := os.ReadFile(filepath.Join(dir, "pids"))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range strings.Fields(string(b)) {
				pid, _ := strconv.Atoi(f)
				if !procGone(pid, 10*time.Second) {
					t.Errorf("process %d the block left in the background still runs", pid)
				}
			}
		})
	}
}

// procGone waits up to d for process pid to end (a zombie has ended: whoever
// adopted it may be slow to reap it).
func procGone(pid int, d time.Duration) bool {
	for deadline := time.Now().Add(d); ; {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return true
		}
		// The state follows the command's name in brackets.
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && strings.HasPrefix(string(b[i:]), ") Z") {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}
