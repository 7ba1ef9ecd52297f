package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// What an exec's output stream must hold however it is carried (the binary
// stream, the agent's gathered reads): no output lost or reordered at the
// exit, a background child that keeps the output open does not hold the
// exec, stdin streams both ways, and a fork in the middle of a streaming
// exec works.

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// TestExecOutputStreams: 8 MiB of random output, written just before the
// command exits, all arrive (compared with the command's own checksum);
// 8 MiB of stdin reach the command intact, through the Go client's framed
// body and through the CLI.
func TestExecOutputStreams(t *testing.T) {
	e := need(t)
	for _, p := range providers {
		t.Run(p, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: p})
			ctx := ctxT(t)
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
			// A command that ends before it reads (or before the host
			// holds its end of stdin): the exec is still fine.
			for i := 0; i < 20; i++ {
				res, err := e.c.ExecPipe(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}}, strings.NewReader("ignored\n"), io.Discard, io.Discard)
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("stdin to true, try %d: %+v %v", i, res, err)
				}
			}
			stdout, _, code := e.cli(t, string(in), "exec", sb.ID, "sha256sum")
			if got := strings.Fields(stdout); code != 0 || len(got) == 0 || got[0] != sha(in) {
				t.Errorf("stdin through the CLI: %q (exit %d), want %s", stdout, code, sha(in))
			}
		})
	}
}

// TestExecOutputBackgroundChild: a command that leaves a child holding its
// stdout ends when it does (the child's later output is not waited for),
// the child runs on, and its output is drained inside (it never blocks).
func TestExecOutputBackgroundChild(t *testing.T) {
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
			// 300 × 64 KiB: far more than a pipe holds, so the child
			// finishes only if its output is drained.
			waitFile(t, sb.ID, "/tmp/child-done")
		})
	}
}

// TestExecOutputForkMidStream: a fork taken while an exec streams its
// output works; the source's exec goes on to its end with all its output,
// and the fork answers.
func TestExecOutputForkMidStream(t *testing.T) {
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
	// drained inside the fork).
	waitFor(t, 30*time.Second, func() bool {
		ps := execOK(t, fk.ID, "ps", "-o", "args")
		return !strings.Contains(ps, "line$i")
	})
}
