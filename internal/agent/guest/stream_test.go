package guest

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/useshards/shard/internal/agent/proto"
	"github.com/useshards/shard/internal/framing"
)

// After FrameDetach the agent drops the output inside: the client receives
// only what was already on its way, and still the exit.
func TestExecDetachDropsOutputInside(t *testing.T) {
	c := testAgent(t)
	start := time.Now()
	s := startExec(t, c, proto.Request{Argv: []string{"yes"}, TimeoutMS: 1500})
	if !s.Has(proto.CapDetach) || !s.Has(proto.CapStdinCredit) {
		t.Fatalf("Started caps = %q, want %q and %q", s.Caps, proto.CapDetach, proto.CapStdinCredit)
	}
	for s.Received() < 1<<20 {
		if _, _, err := s.Recv(); err != nil {
			t.Fatalf("Recv() = %v before 1 MiB of output", err)
		}
	}
	if !s.Detach() {
		t.Fatal("Detach() = false, want true from an agent that lists it")
	}
	at := s.Received()
	r := collect(t, s, start)
	// What was in flight: the agent's socket buffer and ours (a few MiB
	// on loopback at most). Without the detach, `yes` sends hundreds of
	// MiB in the 1.5 s.
	const inFlight = 16 << 20
	if after := s.Received() - at; after > inFlight {
		t.Errorf("after Detach() the agent still sent %d bytes of output, want at most %d (in flight)", after, inFlight)
	}
	// Output dropped inside is still counted: it is what the command wrote.
	if want := (proto.Exit{Code: 137, Signal: 9, TimedOut: true, StdoutBytes: r.exit.StdoutBytes}); r.exit != want || r.exit.StdoutBytes <= s.Received() {
		t.Errorf("detached `yes` with a 1.5s timeout: exit = %+v, want %+v with stdout_bytes above the %d received (the exit still comes)", r.exit, want, s.Received())
	}
}

// A detached command runs on to its end; its output never blocks it.
func TestExecDetachedCommandFinishes(t *testing.T) {
	c := testAgent(t)
	start := time.Now()
	// 64 MiB: far more than every buffer between it and the client.
	const n = 64 << 20
	s := startExec(t, c, proto.Request{Argv: []string{"head", "-c", fmt.Sprint(n), "/dev/zero"}})
	if !s.Detach() {
		t.Fatal("Detach() = false")
	}
	r := collect(t, s, start)
	if r.exit != (proto.Exit{StdoutBytes: n}) {
		t.Errorf("detached command exit = %+v, want 0 with stdout_bytes %d (all it wrote, dropped or not)", r.exit, n)
	}
	if len(r.stdout) >= n {
		t.Errorf("detached command: all %d bytes of output came through, want them dropped", len(r.stdout))
	}
}

// Stdin moves only as the command reads it: a command that never reads
// holds up the client (not the agent's memory), and signals still pass.
func TestExecStdinWindow(t *testing.T) {
	c := testAgent(t)
	start := time.Now()
	s := startExec(t, c, proto.Request{Argv: []string{"sleep", "30"}, Stdin: true})
	if w, credit := s.Window(); !credit || w != stdinWindow {
		t.Fatalf("Started: stdin credit %v, window %d; want true, %d", credit, w, stdinWindow)
	}
	sent := make(chan error, 1)
	go func() { sent <- s.Stdin(make([]byte, 4<<20)) }()
	// Wait until Stdin sent its whole first window. Credit comes only
	// through Recv, which nobody calls yet: Stdin cannot finish.
	for {
		if w, _ := s.Window(); w == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-sent:
		t.Fatalf("Stdin(4 MiB) to `sleep 30` returned %v with no credit given, want it held up by the window", err)
	default:
	}
	// The signal goes behind the window of stdin the agent holds.
	if err := s.Signal(int(syscall.SIGKILL)); err != nil {
		t.Fatalf("Signal() = %v", err)
	}
	r := collect(t, s, start)
	if r.exit.Signal != int(syscall.SIGKILL) {
		t.Errorf("SIGKILL behind unread stdin: exit %+v, want signal 9", r.exit)
	}
	// Once the command is gone its stdin drains (credited as dropped), and
	// Close ends a Stdin still waiting: it returns, whatever it says.
	s.Close()
	<-sent
}

// A lot of stdin through the window arrives whole and in order.
func TestExecStdinThroughWindow(t *testing.T) {
	c := testAgent(t)
	start := time.Now()
	s := startExec(t, c, proto.Request{Argv: sh("wc -c; cksum"), Stdin: true})
	const n = 5<<20 + 123
	in := make([]byte, n)
	for i := range in {
		in[i] = byte(i * 7)
	}
	go func() {
		if s.Stdin(in) == nil {
			s.CloseStdin()
		}
	}()
	r := collect(t, s, start)
	if got := strings.Fields(r.stdout); len(got) == 0 || got[0] != fmt.Sprint(n) || r.exit.Code != 0 || r.exit.StdinBytes != int64(n) {
		t.Errorf("wc -c of %d bytes of stdin = %q, exit %+v; want %d, exit 0 with stdin_bytes %d", n, r.stdout, r.exit, n, n)
	}
}

// A client that ignores the window still cannot queue more than
// stdinHardCap in the agent: past it the agent stops reading and TCP holds
// the client up. The exit still comes when the command ends.
func TestExecStdinHardCap(t *testing.T) {
	c := testAgent(t)
	conn, err := net.Dial("tcp", c.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	b, _ := json.Marshal(proto.Request{Token: testToken, Op: proto.OpExec, Argv: []string{"sleep", "3"}, Stdin: true})
	if err := framing.Write(conn, proto.FrameRequest, b); err != nil {
		t.Fatal(err)
	}
	if typ, p, err := framing.Read(conn); err != nil || typ != proto.FrameStarted {
		t.Fatalf("first frame %q %q, %v; want started", typ, p, err)
	}
	const total = 256 << 20
	var sent atomic.Int64
	done := make(chan error, 1)
	go func() {
		frame := make([]byte, 1<<20)
		for sent.Load() < total {
			if err := framing.Write(conn, proto.FrameStdin, frame); err != nil {
				done <- err
				return
			}
			sent.Add(int64(len(frame)))
		}
		done <- nil
	}()
	// Held up: no progress for a while (or all sent, which fails).
	last, still := int64(-1), 0
	for still < 5 {
		select {
		case err := <-done:
			t.Fatalf("a client ignoring the window sent all %d MiB (%v), want it held up", sent.Load()>>20, err)
		case <-time.After(100 * time.Millisecond):
		}
		if n := sent.Load(); n == last {
			still++
		} else {
			last, still = n, 0
		}
	}
	// The agent holds stdinHardCap; the rest is in the two sockets' buffers.
	if last > 32<<20 {
		t.Errorf("a client ignoring the window got %d MiB out before it was held up, want < 32 MiB", last>>20)
	}
	// The command ends; the exit comes all the same.
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	for {
		typ, p, err := framing.Read(conn)
		if err != nil {
			t.Fatalf("no exit frame after the command ended: %v", err)
		}
		if typ == proto.FrameExit {
			var ex proto.Exit
			json.Unmarshal(p, &ex)
			if ex.Code != 0 || ex.Signal != 0 || ex.Error != "" {
				t.Errorf("exit = %+v, want 0", ex)
			}
			return
		}
	}
}
