package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// An exec's stdio are host FIFOs in the sandbox's /.shard-io
// (docs/exec-stream.md). These tests hold what that must not change: no
// output lost or reordered at the exit, a background child that keeps the
// output open does not hold the exec, stdin streams both ways, a sandbox
// that lists or replaces the directory still gets its output (through the
// agent), and a fork in the middle of a streaming exec works.

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// TestExecDirectIOStreams: 8 MiB of random output, written just before the
// command exits, all arrive (compared with the command's own checksum);
// 8 MiB of stdin reach the command intact, through the Go client's framed
// body and through the CLI; the command's fds are the FIFOs (not pipes).
func TestExecDirectIOStreams(t *testing.T) {
	e := need(t)
	for _, p := range providers {
		t.Run(p, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: p})
			ctx := ctxT(t)
			if out := execOK(t, sb.ID, "readlink", "/proc/self/fd/1"); !strings.HasPrefix(out, "/.shard-io/") {
				t.Errorf("the command's stdout is %q, want a FIFO in /.shard-io", out)
			}
			var out, errb bytes.Buffer
			res, err := e.c.ExecStream(ctx, sb.ID, client.ExecRequest{Argv: []string{"sh", "-c",
				"head -c 8388608 /dev/urandom > /tmp/r; sha256sum /tmp/r >&2; cat /tmp/r; exit 7"}}, &out, &errb)
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != 7 {
				t.Errorf("exit %d, want 7", res.ExitCode)
			}
			if want := strings.Fields(errb.String()); len(want) == 0 || sha(out.Bytes()) != want[0] {
				t.Errorf("stdout: %d bytes, sha %s; the command's own: %q", out.Len(), sha(out.Bytes()), errb.String())
			}

			in := make([]byte, 8<<20)
			for i := range in {
				in[i] = byte(i * 7)
			}
			out.Reset()
			res, err = e.c.ExecPipe(ctx, sb.ID, client.ExecRequest{Argv: []string{"sha256sum"}}, bytes.NewReader(in), &out, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Fields(out.String()); res.ExitCode != 0 || len(got) == 0 || got[0] != sha(in) {
				t.Errorf("stdin through the client: %q (exit %d), want %s", out.String(), res.ExitCode, sha(in))
			}
			stdout, _, code := e.cli(t, string(in), "exec", sb.ID, "sha256sum")
			if got := strings.Fields(stdout); code != 0 || len(got) == 0 || got[0] != sha(in) {
				t.Errorf("stdin through the CLI: %q (exit %d), want %s", stdout, code, sha(in))
			}
		})
	}
}

// TestExecDirectIOBackgroundChild: a command that leaves a child holding its
// stdout ends when it does (the child's later output is not waited for),
// the child runs on, and its FIFO is drained inside (it never blocks).
func TestExecDirectIOBackgroundChild(t *testing.T) {
	e := need(t)
	for _, p := range providers {
		t.Run(p, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: p})
			start := time.Now()
			res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"sh", "-c",
				"(i=0; while [ $i -lt 300 ]; do head -c 65536 /dev/zero; i=$((i+1)); sleep 0.01; done; touch /tmp/child-done) & echo parent"}})
			if err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("the exec took %v, want it to end with its command, not its child", d)
			}
			if !strings.HasPrefix(string(res.Stdout), "parent\n") {
				t.Errorf("stdout starts %q, want parent", res.Stdout[:min(len(res.Stdout), 20)])
			}
			// 300 × 64 KiB: far more than a FIFO holds, so the child
			// finishes only if its output is drained.
			waitFile(t, sb.ID, "/tmp/child-done")
		})
	}
}

// TestExecDirectIOSandboxInterferes: a sandbox that lists /.shard-io (which
// hides later FIFOs from gVisor's view), or replaces it with a symlink to a
// host directory, still gets its commands' output (through the agent), and
// nothing lands on the host. After the listing, the agent makes the
// directory anew and FIFOs are used again.
func TestExecDirectIOSandboxInterferes(t *testing.T) {
	need(t)
	for _, p := range providers {
		t.Run(p, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: p})
			execOK(t, sb.ID, "ls", "-la", "/.shard-io")
			if out := execOK(t, sb.ID, "echo", "after listing"); out != "after listing\n" {
				t.Errorf("after listing /.shard-io: %q", out)
			}
			waitFor(t, 10*time.Second, func() bool {
				out := execOK(t, sb.ID, "readlink", "/proc/self/fd/1")
				return strings.HasPrefix(out, "/.shard-io/")
			})

			victim := t.TempDir()
			execOK(t, sb.ID, "sh", "-c", "rm -rf /.shard-io && ln -s "+victim+" /.shard-io")
			if out := execOK(t, sb.ID, "echo", "after symlink"); out != "after symlink\n" {
				t.Errorf("after the symlink: %q", out)
			}
			if ents, _ := os.ReadDir(victim); len(ents) != 0 {
				t.Errorf("the host directory the sandbox pointed at got %d entries, want none", len(ents))
			}
			// A regular file in place of the directory: the same.
			execOK(t, sb.ID, "sh", "-c", "rm -f /.shard-io && echo x > /.shard-io")
			if out := execOK(t, sb.ID, "echo", "after file"); out != "after file\n" {
				t.Errorf("after the file: %q", out)
			}
		})
	}
}

// TestExecDirectIOForkMidStream: a fork taken while an exec streams its
// output works; the source's exec goes on to its end with all its output,
// and the fork answers (its copy of the command finds its FIFOs).
func TestExecDirectIOForkMidStream(t *testing.T) {
	e := need(t)
	sb := create(t, client.CreateRequest{Image: busybox})
	ctx := ctxT(t)
	type result struct {
		out []byte
		res *client.ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		var out bytes.Buffer
		res, err := e.c.ExecStream(ctx, sb.ID, client.ExecRequest{Argv: []string{"sh", "-c",
			"i=0; while [ $i -lt 40 ]; do echo line$i; i=$((i+1)); sleep 0.1; done"}}, &out, io.Discard)
		done <- result{out.Bytes(), res, err}
	}()
	time.Sleep(1 * time.Second)
	fk, err := e.c.Fork(ctx, sb.ID, client.ForkRequest{})
	if err != nil {
		t.Fatalf("fork during a streaming exec: %v", err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), fk.ID, true) })
	if out := execOK(t, fk.ID, "echo", "fork"); out != "fork\n" {
		t.Errorf("exec in the fork: %q", out)
	}
	r := <-done
	if r.err != nil || r.res.ExitCode != 0 {
		t.Fatalf("the source's exec: %v %+v", r.err, r.res)
	}
	var want strings.Builder
	for i := 0; i < 40; i++ {
		want.WriteString("line" + strconv.Itoa(i) + "\n")
	}
	if string(r.out) != want.String() {
		t.Errorf("the source's exec output %q, want 40 lines in order", r.out)
	}
	// The fork's copy of the command runs to its end too (its output is
	// drained inside the fork), and leaves no FIFO behind.
	waitFor(t, 30*time.Second, func() bool {
		ps := execOK(t, fk.ID, "ps", "-o", "args")
		return !strings.Contains(ps, "line$i")
	})
	waitFor(t, 10*time.Second, func() bool {
		ents, _ := os.ReadDir(filepath.Join(e.dataDir, "run", fk.ID, "rootfs", ".shard-io"))
		return len(ents) == 0
	})
}
