package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/useshards/shard/internal/agent/host"

	"github.com/useshards/shard/internal/agent/proto"
	"github.com/useshards/shard/internal/envlist"
	"github.com/useshards/shard/internal/framing"
	"github.com/useshards/shard/internal/testenv"
)

const testToken = "t"

// One agent serves the whole test binary. Its reaper waits for every child
// of the process (as PID 1 must), so two reapers would steal each other's
// exit statuses; and its context is never cancelled: shutdown() signals
// every process it can reach when it runs as a sandbox's init.
var (
	agentOnce sync.Once
	agentAddr string
	agentErr  error
)

// testAgent returns a client of the shared in-process agent, starting it on
// first use.
func testAgent(t *testing.T) *host.Client {
	t.Helper()
	agentOnce.Do(func() {
		// Serve listens itself: find a free port, then let it take it.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			agentErr = err
			return
		}
		addr := ln.Addr().String()
		ln.Close()
		// Adopt orphans the way a sandbox's init does, so the agent's
		// reaper (not the host's init) reaps the background children that
		// outlive their command.
		const prSetChildSubreaper = 36 // PR_SET_CHILD_SUBREAPER
		syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
		s := &Server{
			token:   testToken,
			baseEnv: append(os.Environ(), "SHARD_TEST_BASE=base", "SHARD_TEST_KEEP=keep"),
			log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
			reaper:  newReaper(),
		}
		served := make(chan error, 1)
		go func() { served <- s.Serve(context.Background(), addr) }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ready := make(chan error, 1)
		go func() { ready <- (&host.Client{Addr: addr, Token: testToken}).WaitReady(ctx) }()
		select {
		case err := <-served:
			agentErr = fmt.Errorf("Serve(%s) returned early: %v", addr, err)
		case err := <-ready:
			agentErr = err
		}
		agentAddr = addr
	})
	if agentErr != nil {
		t.Fatalf("start the test agent: %v", agentErr)
	}
	return &host.Client{Addr: agentAddr, Token: testToken}
}

// result is everything an exec sent back.
type result struct {
	pid      int
	stdout   string
	stderr   string
	frames   []byte // frame types before the exit, in order
	maxFrame int    // largest output frame
	exit     proto.Exit
	elapsed  time.Duration // from Exec to the exit frame
	afterErr error         // what Recv returned after the exit frame
}

// startExec starts req and closes the session when the test ends.
func startExec(t *testing.T, c *host.Client, req proto.Request) *host.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.Exec(ctx, req)
	if err != nil {
		t.Fatalf("Exec(%q) error = %v, want nil", req.Argv, err)
	}
	t.Cleanup(func() { s.Close() })
	if s.PID <= 1 {
		t.Fatalf("Exec(%q) pid = %d, want > 1", req.Argv, s.PID)
	}
	// Never hang the test binary on a broken agent.
	s.SetDeadline(time.Now().Add(30 * time.Second))
	return s
}

// collect reads frames until the exit frame.
func collect(t *testing.T, s *host.Session, start time.Time) result {
	t.Helper()
	r := result{pid: s.PID}
	var out, errb strings.Builder
	for {
		typ, p, err := s.Recv()
		if err != nil {
			t.Fatalf("Recv() error = %v before the exit frame (stdout so far %q, stderr %q)", err, out.String(), errb.String())
		}
		switch typ {
		case proto.FrameStdout:
			out.Write(p)
		case proto.FrameStderr:
			errb.Write(p)
		case proto.FrameExit:
			r.elapsed = time.Since(start)
			if err := json.Unmarshal(p, &r.exit); err != nil {
				t.Fatalf("exit frame %q: %v", p, err)
			}
			r.stdout, r.stderr = out.String(), errb.String()
			// The exit frame is the last: once the client closes its
			// side (it closes first, see awaitClose), the agent closes.
			s.CloseWrite()
			_, _, r.afterErr = s.Recv()
			return r
		default:
			t.Fatalf("Recv() frame type %q, want stdout, stderr or exit", typ)
		}
		r.frames = append(r.frames, typ)
		r.maxFrame = max(r.maxFrame, len(p))
	}
}

// run starts req, sends stdin (then closes it if req.Stdin) and collects.
func run(t *testing.T, c *host.Client, req proto.Request, stdin ...string) result {
	t.Helper()
	start := time.Now()
	s := startExec(t, c, req)
	for _, in := range stdin {
		if err := s.Stdin([]byte(in)); err != nil {
			t.Fatalf("Stdin(%q) = %v", in, err)
		}
	}
	if req.Stdin {
		if err := s.CloseStdin(); err != nil {
			t.Fatalf("CloseStdin() = %v", err)
		}
	}
	return collect(t, s, start)
}

func sh(script string) []string { return []string{"sh", "-c", script} }

func TestExec(t *testing.T) {
	c := testAgent(t)
	pathDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(pathDir, "hello-shard"), []byte("#!/bin/sh\necho hello from PATH\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		req        proto.Request
		stdin      []string
		wantOut    string
		wantErr    string
		wantCode   int
		wantSignal int
	}{
		{name: "separate streams and exit code",
			req:     proto.Request{Argv: sh("echo out; echo err >&2; exit 3")},
			wantOut: "out\n", wantErr: "err\n", wantCode: 3},
		{name: "exit 0", req: proto.Request{Argv: []string{"true"}}},
		{name: "exit 255", req: proto.Request{Argv: sh("exit 255")}, wantCode: 255},
		{name: "killed by SIGKILL",
			req:      proto.Request{Argv: sh("kill -9 $$")},
			wantCode: 137, wantSignal: 9},
		{name: "killed by SIGTERM",
			req:      proto.Request{Argv: sh("kill -TERM $$")},
			wantCode: 143, wantSignal: 15},
		{name: "stdin piped to cat",
			req:     proto.Request{Argv: []string{"cat"}, Stdin: true},
			stdin:   []string{"hello ", "world\n", "again"},
			wantOut: "hello world\nagain"},
		{name: "stdin closed at once",
			req: proto.Request{Argv: []string{"cat"}, Stdin: true}},
		{name: "no stdin reads /dev/null",
			req: proto.Request{Argv: []string{"cat"}}},
		{name: "env merge: request overrides, base kept",
			req: proto.Request{Argv: sh(`echo "$SHARD_TEST_BASE $SHARD_TEST_KEEP $SHARD_TEST_NEW"`),
				Env: []string{"SHARD_TEST_BASE=over", "SHARD_TEST_NEW=new"}},
			wantOut: "over keep new\n"},
		{name: "agent token not inherited",
			req:     proto.Request{Argv: sh(`echo "[$SHARD_AGENT_TOKEN]"`)},
			wantOut: "[]\n"},
		{name: "HOME defaults to root's",
			req:     proto.Request{Argv: sh(`echo "$HOME"`)},
			wantOut: "/root\n"},
		{name: "HOME from the request",
			req:     proto.Request{Argv: sh(`echo "$HOME"`), Env: []string{"HOME=/tmp"}},
			wantOut: "/tmp\n"},
		{name: "default working directory",
			req:     proto.Request{Argv: []string{"pwd"}},
			wantOut: "/\n"},
		{name: "working directory",
			req:     proto.Request{Argv: []string{"pwd"}, Dir: pathDir},
			wantOut: pathDir + "\n"},
		{name: "command looked up in the request's PATH",
			req:     proto.Request{Argv: []string{"hello-shard"}, Env: []string{"PATH=" + pathDir + ":/usr/bin:/bin"}},
			wantOut: "hello from PATH\n"},
		{name: "argv passed as is",
			req:     proto.Request{Argv: []string{"sh", "-c", `printf '%s|' "$0" "$@"`, "zero", "a b", "", "*"}},
			wantOut: "zero|a b||*|"},
		{name: "no TTY", req: proto.Request{Argv: sh("test -t 0 || test -t 1")}, wantCode: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, c, tt.req, tt.stdin...)
			if r.stdout != tt.wantOut {
				t.Errorf("Exec(%q) stdout = %q, want %q", tt.req.Argv, r.stdout, tt.wantOut)
			}
			if r.stderr != tt.wantErr {
				t.Errorf("Exec(%q) stderr = %q, want %q", tt.req.Argv, r.stderr, tt.wantErr)
			}
			// The counts: what the command took and wrote, as the agent saw it.
			want := proto.Exit{Code: tt.wantCode, Signal: tt.wantSignal, StdinBytes: int64(len(strings.Join(tt.stdin, ""))),
				StdoutBytes: int64(len(tt.wantOut)), StderrBytes: int64(len(tt.wantErr))}
			if r.exit != want {
				t.Errorf("Exec(%q) exit = %+v, want %+v", tt.req.Argv, r.exit, want)
			}
			if r.afterErr != io.EOF {
				t.Errorf("Exec(%q): Recv() after the exit frame = %v, want io.EOF", tt.req.Argv, r.afterErr)
			}
		})
	}
}

func TestExecAsUser(t *testing.T) {
	testenv.RequireRoot(t, "to switch users")
	c := testAgent(t)
	tests := []struct {
		user, want string
	}{
		{"4242", "4242 4242\n"},
		{"4242:4343", "4242 4343\n"},
		{"root", "0 0\n"},
		{"0:4343", "0 4343\n"},
	}
	for _, tt := range tests {
		r := run(t, c, proto.Request{Argv: sh("echo $(id -u) $(id -g)"), User: tt.user})
		if r.stdout != tt.want || r.exit.Code != 0 {
			t.Errorf("Exec(id, User %q) = %q, exit %+v; want %q, exit 0 (stderr %q)", tt.user, r.stdout, r.exit, tt.want, r.stderr)
		}
	}
}

// TestExecAsUserHome: a command run as a user has that user's home from
// the sandbox's /etc/passwd ("/" for a uid it does not list), not the
// agent's own HOME (the runtime's, root's), unless the request sets HOME.
func TestExecAsUserHome(t *testing.T) {
	testenv.RequireRoot(t, "to switch users")
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	c := testAgent(t)
	tests := []struct {
		user string
		env  []string
		want string
	}{
		{"nobody", nil, nobody.HomeDir},
		{nobody.Uid, nil, nobody.HomeDir},
		{"nobody:" + nobody.Gid, nil, nobody.HomeDir},
		{"4242", nil, "/"},
		{"root", nil, "/root"},
		{"", nil, "/root"},
		{"nobody", []string{"HOME=/tmp"}, "/tmp"},
	}
	for _, tt := range tests {
		r := run(t, c, proto.Request{Argv: sh(`echo "$HOME"`), User: tt.user, Env: tt.env})
		if r.stdout != tt.want+"\n" || r.exit.Code != 0 {
			t.Errorf("Exec(echo $HOME, User %q, Env %q) = %q, exit %+v; want %q (stderr %q)", tt.user, tt.env, r.stdout, r.exit, tt.want, r.stderr)
		}
	}
}

// TestExecEnvHome: HOME is the user's home unless the request sets it, or
// the sandbox's own environment does (EnvOwnHome); a HOME the runtime gave
// the agent is not the sandbox's.
func TestExecEnvHome(t *testing.T) {
	tests := []struct {
		name    string
		base    []string
		ownHome bool
		req     []string
		want    string
	}{
		{"the runtime's HOME", []string{"HOME=/root", "A=1"}, false, nil, "/home/u"},
		{"no HOME at all", []string{"A=1"}, false, nil, "/home/u"},
		{"the sandbox's own HOME", []string{"HOME=/work", "A=1"}, true, nil, "/work"},
		{"own, but none there", []string{"A=1"}, true, nil, "/home/u"},
		{"the request's HOME", []string{"HOME=/root"}, false, []string{"HOME=/req"}, "/req"},
		{"the request's over the sandbox's", []string{"HOME=/work"}, true, []string{"HOME=/req"}, "/req"},
	}
	for _, tt := range tests {
		s := &Server{baseEnv: tt.base, ownHome: tt.ownHome}
		env := s.execEnv(tt.req, "/home/u")
		if got := envlist.Value(env, "HOME"); got != tt.want {
			t.Errorf("%s: execEnv HOME = %q, want %q (env %q)", tt.name, got, tt.want, env)
		}
		if envlist.Value(env, "A") != envlist.Value(tt.base, "A") {
			t.Errorf("%s: execEnv lost the sandbox's A: %q", tt.name, env)
		}
	}
}

func TestExecLargeOutput(t *testing.T) {
	c := testAgent(t)
	const n = 3 << 20
	r := run(t, c, proto.Request{Argv: []string{"head", "-c", fmt.Sprint(n), "/dev/zero"}})
	if len(r.stdout) != n || r.exit.Code != 0 {
		t.Errorf("Exec(head -c %d) = %d bytes, exit %+v; want %d bytes, exit 0", n, len(r.stdout), r.exit, n)
	}
	if r.maxFrame > proto.MaxFrame {
		t.Errorf("largest output frame = %d bytes, want <= MaxFrame (%d)", r.maxFrame, proto.MaxFrame)
	}
	if len(r.frames) < 2 {
		t.Errorf("%d bytes of output came in %d frames, want them streamed in several", n, len(r.frames))
	}
}

func TestExecTimeout(t *testing.T) {
	c := testAgent(t)
	r := run(t, c, proto.Request{Argv: []string{"sleep", "10"}, TimeoutMS: 300})
	want := proto.Exit{Code: 137, Signal: 9, TimedOut: true}
	if r.exit != want {
		t.Errorf("Exec(sleep 10, timeout 300ms) exit = %+v, want %+v", r.exit, want)
	}
	if r.elapsed < 250*time.Millisecond || r.elapsed > 2*time.Second {
		t.Errorf("Exec(sleep 10, timeout 300ms) took %v, want about 300ms", r.elapsed)
	}
}

// The timeout kills the whole process group, not only the leader.
func TestExecTimeoutKillsGroup(t *testing.T) {
	c := testAgent(t)
	r := run(t, c, proto.Request{Argv: sh("sleep 10; echo survived"), TimeoutMS: 200})
	if !r.exit.TimedOut || strings.Contains(r.stdout, "survived") {
		t.Errorf("Exec(sh -c 'sleep 10; echo survived', timeout) = %q, exit %+v; want timed out and no output", r.stdout, r.exit)
	}
	if r.elapsed > 2*time.Second {
		t.Errorf("Exec with a child sleeping, timeout 200ms, took %v; want well under 2s", r.elapsed)
	}
}

func TestExecNoTimeoutWhenFast(t *testing.T) {
	c := testAgent(t)
	r := run(t, c, proto.Request{Argv: sh("echo ok"), TimeoutMS: 5000})
	if want := (proto.Exit{StdoutBytes: 3}); r.exit != want || r.stdout != "ok\n" {
		t.Errorf("Exec(echo ok, timeout 5s) = %q, %+v; want %q, %+v", r.stdout, r.exit, "ok\n", want)
	}
}

func TestExecSignal(t *testing.T) {
	c := testAgent(t)
	start := time.Now()
	s := startExec(t, c, proto.Request{Argv: []string{"sleep", "10"}})
	if err := s.Signal(int(syscall.SIGTERM)); err != nil {
		t.Fatalf("Signal(SIGTERM) = %v", err)
	}
	r := collect(t, s, start)
	if want := (proto.Exit{Code: 143, Signal: 15}); r.exit != want {
		t.Errorf("Exec(sleep 10) + Signal(SIGTERM): exit = %+v, want %+v", r.exit, want)
	}
	if r.elapsed > 3*time.Second {
		t.Errorf("Exec(sleep 10) + Signal(SIGTERM) took %v, want it to end at once", r.elapsed)
	}
}

// A background child keeps stdout open for ever; the exit frame must not
// wait for it.
func TestExecBackgroundChildDoesNotDelayExit(t *testing.T) {
	c := testAgent(t)
	start := time.Now()
	s := startExec(t, c, proto.Request{Argv: sh("sleep 5 & echo hi")})
	pgid := s.PID
	t.Cleanup(func() {
		// The sleep is still in the command's process group (pgid = the
		// shell's pid): it keeps the group alive, so the id is not reused.
		if pgid > 1 {
			syscall.Kill(-pgid, syscall.SIGKILL)
		}
	})
	r := collect(t, s, start)
	if r.stdout != "hi\n" || r.exit != (proto.Exit{StdoutBytes: 3, OutputCut: true}) {
		t.Errorf("Exec(sleep 5 & echo hi) = %q, %+v; want %q, exit 0", r.stdout, r.exit, "hi\n")
	}
	if r.elapsed > time.Second {
		t.Errorf("Exec(sleep 5 & echo hi) took %v to exit, want < 1s", r.elapsed)
	}
}

// The command keeps running when the client goes away, and its output is
// drained (not closed) so it does not die of SIGPIPE.
func TestExecSurvivesDisconnect(t *testing.T) {
	c := testAgent(t)
	mark := filepath.Join(t.TempDir(), "done")
	// The output (about 20 KB) is written after the client left: with the
	// pipe closed the shell would die of SIGPIPE before writing the mark.
	script := `sleep 0.3; i=0; while [ $i -lt 2000 ]; do echo line $i; i=$((i+1)); done; echo ok > "$1"`
	s := startExec(t, c, proto.Request{Argv: []string{"sh", "-c", script, "sh", mark}})
	s.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(mark)
		if err == nil && string(b) == "ok\n" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the client disconnected, the command did not finish: ReadFile(%s) = %q, %v; want %q", mark, b, err, "ok\n")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestExecTTY(t *testing.T) {
	c := testAgent(t)
	tests := []struct {
		name     string
		req      proto.Request
		stdin    []string
		resize   *proto.Resize // sent before stdin
		want     []string
		wantCode int
	}{
		{name: "stty size",
			req:  proto.Request{TTY: true, Rows: 24, Cols: 80, Stdin: true, Argv: sh("stty size")},
			want: []string{"24 80"}},
		{name: "resize",
			req:    proto.Request{TTY: true, Rows: 24, Cols: 80, Stdin: true, Argv: sh("read x; stty size")},
			resize: &proto.Resize{Rows: 30, Cols: 100}, stdin: []string{"\n"},
			want: []string{"30 100"}},
		{name: "stderr goes to the terminal",
			req:  proto.Request{TTY: true, Argv: sh("echo to-stderr >&2")},
			want: []string{"to-stderr"}},
		{name: "is a terminal",
			req: proto.Request{TTY: true, Argv: sh("test -t 0 && test -t 1 && test -t 2 && echo tty")}, want: []string{"tty"}},
		{name: "TERM defaults to xterm",
			req:  proto.Request{TTY: true, Argv: sh(`echo "term=$TERM"`)},
			want: []string{"term=xterm"}},
		{name: "TERM from the request",
			req:  proto.Request{TTY: true, Argv: sh(`echo "term=$TERM"`), Env: []string{"TERM=dumb"}},
			want: []string{"term=dumb"}},
		{name: "close stdin sends EOF",
			req:   proto.Request{TTY: true, Stdin: true, Argv: []string{"cat"}},
			stdin: []string{"abc\n"}, want: []string{"abc"}},
		{name: "exit code",
			req:      proto.Request{TTY: true, Argv: sh("exit 7")},
			wantCode: 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			s := startExec(t, c, tt.req)
			if tt.resize != nil {
				if err := s.Resize(tt.resize.Rows, tt.resize.Cols); err != nil {
					t.Fatalf("Resize() = %v", err)
				}
			}
			for _, in := range tt.stdin {
				if err := s.Stdin([]byte(in)); err != nil {
					t.Fatalf("Stdin(%q) = %v", in, err)
				}
			}
			if tt.req.Stdin {
				if err := s.CloseStdin(); err != nil {
					t.Fatalf("CloseStdin() = %v", err)
				}
			}
			r := collect(t, s, start)
			for _, w := range tt.want {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("Exec(TTY, %q) output = %q, want it to contain %q", tt.req.Argv, r.stdout, w)
				}
			}
			if r.stderr != "" || slices.Contains(r.frames, proto.FrameStderr) {
				t.Errorf("Exec(TTY, %q) sent stderr frames (%q), want everything on stdout", tt.req.Argv, r.stderr)
			}
			if r.exit.Code != tt.wantCode {
				t.Errorf("Exec(TTY, %q) exit = %+v, want code %d", tt.req.Argv, r.exit, tt.wantCode)
			}
		})
	}
}

func TestExecStartErrors(t *testing.T) {
	c := testAgent(t)
	tests := []struct {
		name     string
		req      proto.Request
		wantCode string
		wantMsg  string
	}{
		{"unknown command", proto.Request{Argv: []string{"no-such-command-shard-test"}}, "command_not_found", "no-such-command-shard-test"},
		{"unknown absolute path", proto.Request{Argv: []string{"/no/such/program"}}, "command_not_found", "/no/such/program"},
		{"not executable", proto.Request{Argv: []string{"/etc/passwd"}}, "command_not_found", "permission denied"},
		{"a directory", proto.Request{Argv: []string{"/tmp"}}, "command_not_found", "is a directory"},
		{"empty PATH in the request", proto.Request{Argv: []string{"sh"}, Env: []string{"PATH=/nonexistent-shard-test"}}, "command_not_found", "sh"},
		{"no argv", proto.Request{}, "invalid_argument", "no command"},
		{"empty argv[0]", proto.Request{Argv: []string{""}}, "invalid_argument", "no command"},
		{"missing working directory", proto.Request{Argv: []string{"true"}, Dir: "/nonexistent-shard-test"}, "invalid_argument", "/nonexistent-shard-test"},
		{"working directory is a file", proto.Request{Argv: []string{"true"}, Dir: "/etc/passwd"}, "invalid_argument", "/etc/passwd"},
		{"unknown user", proto.Request{Argv: []string{"true"}, User: "nosuchuser"}, "invalid_argument", "nosuchuser"},
		{"unknown group", proto.Request{Argv: []string{"true"}, User: "root:nosuchgroup"}, "invalid_argument", "nosuchgroup"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := c.Exec(ctx, tt.req)
			if err == nil {
				s.Close()
				t.Fatalf("Exec(%+v) = started pid %d, want an *host.ErrStart", tt.req, s.PID)
			}
			var es *host.ErrStart
			if !errors.As(err, &es) {
				t.Fatalf("Exec(%+v) error = %T %v, want an *host.ErrStart", tt.req, err, err)
			}
			if es.Info.Code != tt.wantCode {
				t.Errorf("Exec(%+v) error code = %q, want %q (message %q)", tt.req, es.Info.Code, tt.wantCode, es.Info.Message)
			}
			if !strings.Contains(es.Error(), tt.wantMsg) {
				t.Errorf("Exec(%+v) error = %q, want it to mention %q", tt.req, es.Error(), tt.wantMsg)
			}
		})
	}
}

func TestBadToken(t *testing.T) {
	good := testAgent(t)
	for _, tok := range []string{"", "wrong", testToken + testToken, testToken + " "} {
		c := &host.Client{Addr: good.Addr, Token: tok}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s, err := c.Exec(ctx, proto.Request{Argv: []string{"true"}})
		if err == nil {
			s.Close()
			t.Errorf("Exec with token %q = started, want an error", tok)
		} else {
			var es *host.ErrStart
			if errors.As(err, &es) || !strings.Contains(err.Error(), "bad token") {
				t.Errorf("Exec with token %q error = %T %q, want a refusal mentioning %q", tok, err, err, "bad token")
			}
		}
		if _, err := c.Call(ctx, proto.OpPing); err == nil || !strings.Contains(err.Error(), "bad token") {
			t.Errorf("Call(ping) with token %q = %v, want an error mentioning %q", tok, err, "bad token")
		}
		cancel()
	}
}

func TestCallOps(t *testing.T) {
	c := testAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tests := []struct {
		op      string
		wantErr string // "" for success
	}{
		{proto.OpPing, ""},
		{proto.OpStats, ""},
		{"bogus", "unknown op bogus"},
		{"", "unknown op"},
	}
	for _, tt := range tests {
		r, err := c.Call(ctx, tt.op)
		if tt.wantErr == "" {
			if err != nil || r == nil || !r.OK {
				t.Errorf("Call(%q) = %+v, %v; want OK", tt.op, r, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("Call(%q) error = %v, want it to mention %q", tt.op, err, tt.wantErr)
		}
		// An op it does not have is marked so, for the host to decide by.
		if r == nil || !r.UnknownOp || !errors.Is(err, host.ErrUnsupported) {
			t.Errorf("Call(%q) = %+v, %v; want the refusal marked unknown_op (host.ErrUnsupported)", tt.op, r, err)
		}
	}
	// Ping lists what it can do, as an exec's start does.
	got, err := c.Caps(ctx)
	if err != nil || !slices.Equal(got, caps) {
		t.Errorf("Caps() = %q, %v; want %q", got, err, caps)
	}
	for _, cp := range []string{proto.CapDetach, proto.CapStdinCredit, proto.CapMemCheck, proto.CapGrantFile, proto.CapForked} {
		if !got.Has(cp) {
			t.Errorf("the agent does not list %q", cp)
		}
	}
	// No OOM guard in this agent: stats are all zero.
	r, err := c.Call(ctx, proto.OpStats)
	if err != nil || r.MemoryUsed != 0 || r.MemoryLimit != 0 || r.OOMKills != 0 {
		t.Errorf("Call(stats) without a guard = %+v, %v; want zeros", r, err)
	}
}

// A connection whose first frame is not a valid request is dropped.
func TestBadFirstFrame(t *testing.T) {
	c := testAgent(t)
	tests := []struct {
		name    string
		typ     byte
		payload string
	}{
		{"stdin first", proto.FrameStdin, "hello"},
		{"request not JSON", proto.FrameRequest, "{not json"},
		{"request wrong JSON type", proto.FrameRequest, `{"token": 5}`},
	}
	for _, tt := range tests {
		conn, err := net.DialTimeout("tcp", c.Addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		if err := framing.Write(conn, tt.typ, []byte(tt.payload)); err != nil {
			t.Fatalf("%s: framing.Write = %v", tt.name, err)
		}
		typ, p, err := framing.Read(conn)
		if err != io.EOF {
			t.Errorf("%s: the agent answered %q %q, %v; want the connection closed (io.EOF)", tt.name, typ, p, err)
		}
		conn.Close()
	}
}

// Many commands at once, each exiting at once: the reaper must hand every
// status to the right waiter.
func TestExecConcurrent(t *testing.T) {
	c := testAgent(t)
	const workers, each = 4, 8
	var wg sync.WaitGroup
	errs := make(chan string, workers*each)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				code := (w*each + i) % 100
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				s, err := c.Exec(ctx, proto.Request{Argv: sh(fmt.Sprintf("echo %d; exit %d", code, code))})
				cancel()
				if err != nil {
					errs <- fmt.Sprintf("Exec(exit %d) = %v", code, err)
					continue
				}
				s.SetDeadline(time.Now().Add(30 * time.Second))
				var out string
				var ex *proto.Exit
				for ex == nil {
					typ, p, err := s.Recv()
					if err != nil {
						errs <- fmt.Sprintf("Exec(exit %d): Recv() = %v", code, err)
						break
					}
					switch typ {
					case proto.FrameStdout:
						out += string(p)
					case proto.FrameExit:
						ex = new(proto.Exit)
						json.Unmarshal(p, ex)
					}
				}
				s.Close()
				if ex != nil && (ex.Code != code || out != fmt.Sprintf("%d\n", code)) {
					errs <- fmt.Sprintf("Exec(echo %d; exit %d) = %q, %+v; want %q, code %d", code, code, out, *ex, fmt.Sprintf("%d\n", code), code)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestNewServerFromEnv(t *testing.T) {
	tests := []struct {
		name      string
		token     string // "" leaves it unset
		memLimit  string // "" leaves it unset
		wantErr   string
		wantGuard int64
	}{
		{name: "no token", wantErr: "no token"},
		{name: "token", token: "secret"},
		{name: "token and memory limit", token: "secret", memLimit: "1048576", wantGuard: 1 << 20},
		{name: "bad memory limit", token: "secret", memLimit: "lots", wantErr: proto.EnvMemoryLimit},
		{name: "zero memory limit", token: "secret", memLimit: "0", wantErr: proto.EnvMemoryLimit},
		{name: "negative memory limit", token: "secret", memLimit: "-5", wantErr: proto.EnvMemoryLimit},
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// t.Setenv restores (or unsets) the variables when the test ends.
			t.Setenv(proto.EnvToken, tt.token)
			t.Setenv(proto.EnvMemoryLimit, tt.memLimit)
			if tt.token == "" {
				os.Unsetenv(proto.EnvToken)
			}
			if tt.memLimit == "" {
				os.Unsetenv(proto.EnvMemoryLimit)
			}
			t.Setenv("SHARD_TEST_PLAIN", "plain")
			s, err := NewServerFromEnv(log)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("NewServerFromEnv() error = %v, want it to mention %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewServerFromEnv() error = %v, want nil", err)
			}
			if s.token != tt.token {
				t.Errorf("NewServerFromEnv() token = %q, want %q", s.token, tt.token)
			}
			if _, ok := os.LookupEnv(proto.EnvToken); ok {
				t.Errorf("NewServerFromEnv() left %s in the process environment", proto.EnvToken)
			}
			if envlist.Has(s.baseEnv, proto.EnvToken) || envlist.Has(s.baseEnv, proto.EnvMemoryLimit) {
				t.Errorf("NewServerFromEnv() baseEnv keeps the agent's own variables: %q", s.baseEnv)
			}
			if got := envlist.Value(s.baseEnv, "SHARD_TEST_PLAIN"); got != "plain" {
				t.Errorf("NewServerFromEnv() baseEnv SHARD_TEST_PLAIN = %q, want %q", got, "plain")
			}
			switch {
			case tt.wantGuard == 0 && s.guard != nil:
				t.Errorf("NewServerFromEnv() guard = %+v, want none", s.guard)
			case tt.wantGuard != 0 && (s.guard == nil || s.guard.limit != tt.wantGuard):
				t.Errorf("NewServerFromEnv() guard = %+v, want limit %d", s.guard, tt.wantGuard)
			}
			if s.reaper == nil || s.log == nil {
				t.Errorf("NewServerFromEnv() reaper = %v, log = %v; want both set", s.reaper, s.log)
			}
		})
	}
}

// A signal must reach the command even when stdin sent before it is still
// waiting for the command to read it (Ctrl-C on `cmd < big-file`).
func TestExecSignalBehindUnreadStdin(t *testing.T) {
	c := testAgent(t)
	start := time.Now()
	s := startExec(t, c, proto.Request{Argv: []string{"sleep", "2"}, Stdin: true})
	// More than a pipe holds; sleep never reads it.
	if err := s.Stdin(make([]byte, 256<<10)); err != nil {
		t.Fatalf("Stdin() = %v", err)
	}
	if err := s.Signal(int(syscall.SIGTERM)); err != nil {
		t.Fatalf("Signal() = %v", err)
	}
	r := collect(t, s, start)
	if r.exit.Signal != int(syscall.SIGTERM) {
		t.Fatalf("Signal(SIGTERM) queued behind unread stdin was not delivered: exit %+v after %v, want signal 15 at once (server.go: the frame reader blocks in writeStdin)", r.exit, r.elapsed)
	}
	if r.elapsed > time.Second {
		t.Errorf("Signal(SIGTERM) behind unread stdin took %v to end the command, want < 1s", r.elapsed)
	}
}

// Closing a TTY's stdin after a partial line must still end input (EOF).
func TestExecTTYCloseStdinAfterPartialLine(t *testing.T) {
	c := testAgent(t)
	start := time.Now()
	s := startExec(t, c, proto.Request{Argv: []string{"cat"}, TTY: true, Stdin: true, TimeoutMS: 1000})
	if err := s.Stdin([]byte("abc")); err != nil { // no newline
		t.Fatalf("Stdin() = %v", err)
	}
	if err := s.CloseStdin(); err != nil {
		t.Fatalf("CloseStdin() = %v", err)
	}
	r := collect(t, s, start)
	if r.exit.TimedOut {
		t.Fatalf("after a partial line, CloseStdin on a TTY only flushes the line (one ^D); cat never saw EOF: output %q, exit %+v", r.stdout, r.exit)
	}
	if r.exit.Code != 0 || !strings.Contains(r.stdout, "abc") {
		t.Errorf("Exec(TTY cat) with %q then CloseStdin = %q, exit %+v; want abc echoed and exit 0", "abc", r.stdout, r.exit)
	}
}

// The agent never closes a connection first after answering (its TIME_WAIT
// would be saved in every checkpoint): it waits for the client, and then
// closes at once.
func TestAgentLetsClientCloseFirst(t *testing.T) {
	c := testAgent(t)
	for _, req := range []proto.Request{{Op: proto.OpPing}, {Op: proto.OpExec, Argv: []string{"true"}}} {
		conn, err := net.DialTimeout("tcp", c.Addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		req.Token = testToken
		b, _ := json.Marshal(req)
		if err := framing.Write(conn, proto.FrameRequest, b); err != nil {
			t.Fatal(err)
		}
		// Read to the last frame: the reply, or the exit frame of an exec.
		for {
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			typ, _, err := framing.Read(conn)
			if err != nil {
				t.Fatalf("%s: framing.Read = %v before the last frame", req.Op, err)
			}
			if typ == proto.FrameReply || typ == proto.FrameExit {
				break
			}
		}
		conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if typ, p, err := framing.Read(conn); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s: after the last frame framing.Read = %q %q %v; want the agent to wait for our close (deadline exceeded)", req.Op, typ, p, err)
		}
		conn.(*net.TCPConn).CloseWrite()
		conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, _, err := framing.Read(conn); err != io.EOF {
			t.Errorf("%s: after our close framing.Read = %v, want io.EOF at once", req.Op, err)
		}
		conn.Close()
	}
}

// waitTail ends when the output is drained, and otherwise only after the
// pumps spent tailQuiet not held up by the client nor leaving output in the
// pipes (that up to tailPending): a slow client holds it (so nothing
// written before the exit is cut), a quiet background child does not. Once
// every writer is gone (hup) it waits for drained, however long that takes.
// Counted in looks at the pumps, not in wall time.
func TestWaitTail(t *testing.T) {
	drained := make(chan struct{})
	close(drained)
	var looks atomic.Int32
	yes := func() bool { return true }
	no := func() bool { return false }
	if cut := waitTail(drained, func() bool { looks.Add(1); return true }, yes, no); cut || looks.Load() > 1 {
		t.Errorf("drained: looked at the pumps %d times (cut %v), want it to end at once, not cut", looks.Load(), cut)
	}

	quietLooks := int32(tailQuiet / tailTick)
	pendingLooks := int32(tailPending / tailTick)
	for _, tt := range []struct {
		name       string
		sendingFor int32 // looks
		pendingFor int32 // looks
		want       int32
	}{
		{"quiet at once", 0, 0, quietLooks},
		{"sending 1", 1, 0, 1 + quietLooks},
		{"sending 30", 30, 0, 30 + quietLooks},
		{"output left in a pipe for 20 looks", 0, 20, 20 + quietLooks},
		// A pipe never empty (a background writer): waited for up to
		// tailPending, then the quiet rule alone.
		{"output left for ever", 0, 1 << 30, pendingLooks - 1 + quietLooks},
	} {
		looks.Store(0)
		var pl atomic.Int32
		pending := func() bool { return pl.Add(1) <= tt.pendingFor }
		if tt.pendingFor == 0 {
			pending = no
		}
		cut := waitTail(make(chan struct{}), func() bool { return looks.Add(1) <= tt.sendingFor }, pending, no)
		if got := looks.Load(); got != tt.want || !cut {
			t.Errorf("%s: waited %d looks (cut %v), want %d, cut", tt.name, got, cut, tt.want)
		}
	}

	// Every writer gone: it waits for drained past the quiet bound.
	late := make(chan struct{})
	go func() { time.Sleep(tailQuiet * 3); close(late) }()
	start := time.Now()
	if cut := waitTail(late, no, no, yes); cut || time.Since(start) < tailQuiet*3 {
		t.Errorf("hup: returned after %v (cut %v), want it to wait for drained (%v), not cut", time.Since(start), cut, tailQuiet*3)
	}
}
