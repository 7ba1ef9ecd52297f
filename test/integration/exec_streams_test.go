package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/useshards/shard/client"
)

// leaveAfter is an output writer that calls cancel once n bytes came: the
// client leaves a command that is still writing.
type leaveAfter struct {
	n      int64
	got    atomic.Int64
	cancel context.CancelFunc
}

func (w *leaveAfter) Write(p []byte) (int, error) {
	if w.got.Add(int64(len(p))) >= w.n {
		w.cancel()
	}
	return len(p), nil
}

// procRead is how many bytes process pid read so far (rchar in
// /proc/<pid>/io: files, pipes and sockets alike).
func procRead(t testing.TB, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("/proc/%d/io has no rchar: %q", pid, b)
	return 0
}

// TestExecLeftOutputDroppedInSandbox: a client that leaves an exec of `yes`
// (HTTP stream or WebSocket) leaves no work on the host: the server stops
// reading its output (counted in bytes the server process reads, not in
// time), the command runs on to its timeout and its end is in the ledger.
func TestExecLeftOutputDroppedInSandbox(t *testing.T) {
	e := need(t)
	for _, p := range providers {
		for _, form := range []string{"stream", "websocket"} {
			t.Run(p+"/"+form, func(t *testing.T) {
				sb := create(t, client.CreateRequest{Image: busybox, Provider: p})
				ctx, cancel := context.WithCancel(ctxT(t))
				out := &leaveAfter{n: 1 << 20, cancel: cancel}
				req := client.ExecRequest{Argv: []string{"yes"}, Timeout: json.RawMessage(`"12s"`)}
				var err error
				switch form {
				case "stream":
					_, err = e.c.ExecStream(ctx, sb.ID, req, out, out)
				case "websocket":
					var s *client.ExecSession
					if s, err = e.c.ExecInteractive(ctx, sb.ID, req); err == nil {
						_, err = s.Run(ctx, nil, out, out)
					}
				}
				if ctx.Err() == nil {
					t.Fatalf("exec of yes ended before the client left: %v (%d bytes)", err, out.got.Load())
				}
				left := time.Now()
				// Let what was on its way arrive, then count.
				time.Sleep(2 * time.Second)
				pid := e.server.Process.Pid
				r0, c0 := procRead(t, pid), procCPU(pid)
				time.Sleep(3 * time.Second)
				r1, c1 := procRead(t, pid), procCPU(pid)
				t.Logf("after the client left: shard serve read %d bytes and used %v of CPU in 3s", r1-r0, c1-c0)
				// The host drops nothing any more: what it reads is
				// its own small business (the ledger, cgroup files).
				if r1-r0 > 4<<20 {
					t.Errorf("after the client left `yes`, shard serve read %d bytes in 3s, want < 4 MiB: the output is dropped on the host, not in the sandbox", r1-r0)
				}
				if ps := execOK(t, sb.ID, "ps", "-o", "comm"); !strings.Contains(ps, "yes") {
					t.Errorf("yes is no longer running after the client left (ps: %q), want it to run to its timeout", ps)
				}
				waitFor(t, 30*time.Second, func() bool {
					evs, err := e.c.Events(ctxT(t), sb.Session, 0, 1000)
					if err != nil {
						return false
					}
					for _, ev := range evs.Events {
						var fin struct {
							TimedOut bool `json:"timed_out"`
						}
						if ev.Type == "sandbox.exec_finished" && json.Unmarshal(ev.Data, &fin) == nil && fin.TimedOut {
							return true
						}
					}
					return false
				})
				if d := time.Since(left); d < 5*time.Second {
					t.Errorf("the left exec ended %v after the client left, want its 12s timeout", d)
				}
			})
		}
	}
}

// wsDial opens the WebSocket exec of req in sandbox id over the server's
// Unix socket, as a client that sends what it likes.
func wsDial(t testing.TB, ctx context.Context, id string, req client.ExecRequest) *websocket.Conn {
	t.Helper()
	e := need(t)
	b, _ := json.Marshal(req)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", e.socket)
	}}}
	ws, _, err := websocket.Dial(ctx, "ws://shard/v0/sandboxes/"+id+"/exec?request="+url.QueryEscape(string(b)), &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatalf("dial the exec WebSocket: %v", err)
	}
	ws.SetReadLimit(16 << 20)
	t.Cleanup(func() { ws.CloseNow() })
	return ws
}

// TestExecStdinFloodBounded: a WebSocket client that floods stdin to a
// command that never reads it is held up after a bounded amount (server
// and sandbox hold a small window, not the flood), the sandbox is not
// OOM-killed, closing works, and a message over the cap closes the
// WebSocket with 1009 and a reason.
func TestExecStdinFloodBounded(t *testing.T) {
	e := need(t)
	for _, p := range providers {
		t.Run(p, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: p, Memory: jsonRaw("128MiB")})
			ctx := ctxT(t)
			ws := wsDial(t, ctx, sb.ID, client.ExecRequest{Argv: []string{"sleep", "15"}, Interactive: true})
			if _, msg, err := ws.Read(ctx); err != nil || len(msg) == 0 || msg[0] != client.FrameStarted {
				t.Fatalf("first message %q, %v; want started", msg, err)
			}
			// 512 KiB messages, up to 256 MiB in all: twice the sandbox's
			// memory. Before the window the agent queued 1024 messages.
			const msgSize, total = 512 << 10, 256 << 20
			var sent atomic.Int64
			wctx, stopWriting := context.WithCancel(ctx)
			writerDone := make(chan error, 1)
			go func() {
				msg := make([]byte, 1+msgSize)
				msg[0] = client.FrameStdin
				for sent.Load() < total {
					if err := ws.Write(wctx, websocket.MessageBinary, msg); err != nil {
						writerDone <- err
						return
					}
					sent.Add(msgSize)
				}
				writerDone <- nil
			}()
			// Held up: no progress over 2s (or everything sent, or the
			// connection broken).
			last, still := int64(-1), 0
			for still < 4 {
				select {
				case err := <-writerDone:
					t.Fatalf("the flood ended after %d MiB (%v), want the client held up, still connected", sent.Load()>>20, err)
				case <-time.After(500 * time.Millisecond):
				}
				if n := sent.Load(); n == last {
					still++
				} else {
					last, still = n, 0
				}
			}
			t.Logf("%s: the client got %d KiB of stdin out before it was held up", p, last>>10)
			if last > 32<<20 {
				t.Errorf("the client sent %d MiB of stdin to a command that reads none before it was held up, want < 32 MiB (socket buffers and a small window)", last>>20)
			}
			stopWriting()
			ws.CloseNow()
			<-writerDone
			// The sandbox lives on and answers.
			if out := execOK(t, sb.ID, "echo", "alive"); out != "alive\n" {
				t.Errorf("exec after the flood = %q, want alive", out)
			}
			got, err := e.c.Get(ctx, sb.ID)
			if err != nil || got.State != "running" {
				t.Fatalf("sandbox after the flood: %+v, %v; want running", got, err)
			}

			// A message over the cap: closed with 1009 and why.
			ws2 := wsDial(t, ctx, sb.ID, client.ExecRequest{Argv: []string{"cat"}, Interactive: true})
			ws2.Read(ctx) // started
			big := make([]byte, 2<<20)
			big[0] = client.FrameStdin
			ws2.Write(ctx, websocket.MessageBinary, big)
			var rerr error
			for rerr == nil {
				_, _, rerr = ws2.Read(ctx)
			}
			var ce websocket.CloseError
			if !errors.As(rerr, &ce) || ce.Code != websocket.StatusMessageTooBig || !strings.Contains(ce.Reason, "smaller messages") {
				t.Errorf("a 2 MiB message: the WebSocket ended with %v, want close 1009 with a reason that says to send smaller messages", rerr)
			}
		})
	}
}

// TestExecStalledClientDetached: a client that stays connected but stops
// reading (HTTP stream or WebSocket) is taken as gone after 20 s: the
// server lets go of the exec (its output then dropped in the sandbox), and
// the command's end still lands in the ledger. Before, the stream stayed
// blocked on the client for ever and the end was never recorded. The stall
// is the server's business, not the provider's: gvisor only.
func TestExecStalledClientDetached(t *testing.T) {
	e := need(t)
	sb := create(t, client.CreateRequest{Image: busybox, Provider: "gvisor"})
	ctx := ctxT(t)
	// The WebSocket form: read the started message, then nothing.
	ws := wsDial(t, ctx, sb.ID, client.ExecRequest{Argv: []string{"yes", "ws"}, Timeout: json.RawMessage(`"40s"`)})
	if _, msg, err := ws.Read(ctx); err != nil || msg[0] != client.FrameStarted {
		t.Fatalf("first message %q, %v; want started", msg, err)
	}
	// The HTTP stream: read the first line, then nothing.
	body, _ := json.Marshal(client.ExecRequest{Argv: []string{"yes", "stream"}, Timeout: json.RawMessage(`"40s"`)})
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", e.socket)
	}}}
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://shard/v0/sandboxes/"+sb.ID+"/exec", strings.NewReader(string(body)))
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("exec stream: status %d", resp.StatusCode)
	}
	resp.Body.Read(make([]byte, 64))
	start := time.Now()

	finished := func() int {
		evs, err := e.c.Events(ctx, sb.Session, 0, 1000)
		if err != nil {
			return 0
		}
		n := 0
		for _, ev := range evs.Events {
			var fin struct {
				TimedOut bool `json:"timed_out"`
			}
			if ev.Type == "sandbox.exec_finished" && json.Unmarshal(ev.Data, &fin) == nil && fin.TimedOut {
				n++
			}
		}
		return n
	}
	// Both were let go at about 20 s: the server reads (almost) nothing
	// from then on, while both `yes` run on to their 40 s timeout.
	time.Sleep(25*time.Second - time.Since(start))
	pid := e.server.Process.Pid
	r0 := procRead(t, pid)
	time.Sleep(3 * time.Second)
	if n := procRead(t, pid) - r0; n > 4<<20 {
		t.Errorf("25 s after its clients stopped reading, shard serve still read %d bytes in 3 s, want < 4 MiB (the execs let go)", n)
	}
	waitFor(t, 30*time.Second, func() bool { return finished() == 2 })
	// And the stalled WebSocket was closed by the server.
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var rerr error
	for rerr == nil {
		_, _, rerr = ws.Read(rctx)
	}
	if errors.Is(rerr, context.DeadlineExceeded) {
		t.Errorf("the stalled WebSocket is still open after the exec was let go, want it closed by the server")
	}
}
