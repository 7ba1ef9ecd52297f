package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
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
				// parent is written before the child starts: after it, the
				// child could write first.
				"echo parent; (i=0; while [ $i -lt 300 ]; do head -c 65536 /dev/zero; i=$((i+1)); sleep 0.05; done; touch /tmp/child-done) &"}})
			if err != nil {
				t.Fatal(err)
			}
			// The child runs for 15 s or more: an exec that waited for it
			// would take that long.
			if d := time.Since(start); d > 10*time.Second {
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

// rawFramedExec sends a framed exec body over a raw HTTP/1.1 connection to
// the server's socket (chunked, one chunk a frame), as a client that sends
// what it likes, and returns the connection and its reader.
func rawFramedExec(t *testing.T, id string, frames ...[]byte) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("unix", need(t).socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST /v0/sandboxes/%s/exec HTTP/1.1\r\nHost: shard\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n", id, client.StreamMediaType)
	for _, f := range frames {
		fmt.Fprintf(c, "%x\r\n%s\r\n", len(f), f)
	}
	return c, bufio.NewReader(c)
}

func rawFrame(typ byte, p []byte) []byte {
	f := make([]byte, 5, 5+len(p))
	f[0] = typ
	binary.BigEndian.PutUint32(f[1:], uint32(len(p)))
	return append(f, p...)
}

// TestExecFramedBodyBroken: a stdin frame past 1 MiB ends the stream with
// an error that blames the request (invalid_argument), the server neither
// panics nor stops serving; a framed body left open after the command's
// end has its connection closed (no plain-text answer to what follows on
// it), and the server serves on. Both were found by a red team: the first
// logged a panic in net/http on every try.
func TestExecFramedBodyBroken(t *testing.T) {
	e := need(t)
	sb := create(t, client.CreateRequest{Image: busybox})
	logFrom := int64(0)
	if st, err := os.Stat(e.serveLog); err == nil {
		logFrom = st.Size()
	}
	q, _ := json.Marshal(client.ExecRequest{Argv: []string{"sh", "-c", "cat >/dev/null; echo done"}})
	c, br := rawFramedExec(t, sb.ID, rawFrame('Q', q))
	big := append([]byte{'I', 0, 0x10, 0, 1}, bytes.Repeat([]byte("y"), 1000)...) // declares 1 MiB + 1
	fmt.Fprintf(c, "%x\r\n%s\r\n0\r\n\r\n", len(big), big)
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if !bytes.Contains(body, []byte(`"invalid_argument"`)) || !bytes.Contains(body, []byte("exceeds the limit")) {
		t.Errorf("the stream after an oversized stdin frame: %q, want an F frame with invalid_argument", body)
	}

	q, _ = json.Marshal(client.ExecRequest{Argv: []string{"echo", "hi"}})
	c, br = rawFramedExec(t, sb.ID, rawFrame('Q', q))
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	if !bytes.Contains(body, []byte("hi\n")) {
		t.Errorf("echo hi: %q", body)
	}
	// A framed exec's connection serves nothing after it (the body may
	// end after the response, or never): it says so, and whatever comes
	// next on it meets a closed connection, not a plain-text 400.
	if !resp.Close {
		t.Errorf("a framed exec's answer does not say Connection: close")
	}
	fmt.Fprintf(c, "5\r\n%s\r\n0\r\n\r\nGET /v0/sandboxes HTTP/1.1\r\nHost: shard\r\n\r\n", rawFrame('I', nil))
	if resp, err := http.ReadResponse(br, nil); err == nil {
		b, _ := io.ReadAll(resp.Body)
		t.Errorf("after a framed exec left open: %s %q, want the connection closed", resp.Status, b)
	}
	if out := execOK(t, sb.ID, "echo", "still"); out != "still\n" {
		t.Errorf("exec after: %q", out)
	}
	if b, _ := os.ReadFile(e.serveLog); int64(len(b)) > logFrom && bytes.Contains(b[logFrom:], []byte("panic")) {
		t.Errorf("shard serve logged a panic:\n%s", b[logFrom:])
	}
}

// stallAfter is an output writer that stops for a while once n bytes came:
// a client that reads slowly while the command ends.
type stallAfter struct {
	n, got int
	sum    []byte
	stall  time.Duration
}

func (w *stallAfter) Write(p []byte) (int, error) {
	if w.got < w.n && w.got+len(p) >= w.n {
		time.Sleep(w.stall)
	}
	w.got += len(p)
	w.sum = append(w.sum, p...)
	return len(p), nil
}

// TestExecOutputSlowClient: a client that stops reading for 3 s while the
// command writes its last megabytes and exits still gets all of its output
// before the exit (a red team found the last chunk cut, with exit 0, when
// the agent waited a flat 100 ms for its output after the exit).
func TestExecOutputSlowClient(t *testing.T) {
	e := need(t)
	for _, p := range providers {
		t.Run(p, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: p, Memory: jsonRaw("512MiB")})
			want := strings.Fields(execOK(t, sb.ID, "sh", "-c", "head -c 40000000 /dev/urandom > /tmp/y && sha256sum /tmp/y"))[0]
			for i := 0; i < 3; i++ {
				w := &stallAfter{n: 20 << 20, stall: 3 * time.Second}
				res, err := e.c.ExecStream(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"cat", "/tmp/y"}}, w, io.Discard)
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("try %d: %+v %v", i, res, err)
				}
				if len(w.sum) != 40000000 || sha(w.sum) != want {
					t.Fatalf("try %d: %d bytes, sha %s; want 40000000, %s", i, len(w.sum), sha(w.sum), want)
				}
			}
		})
	}
}
