package host

import (
	"context"
	"encoding/json"
	"net"
	"testing"
	"time"

	"github.com/useshards/shard/internal/agent/proto"
	"github.com/useshards/shard/internal/framing"
)

const testToken = "t"

// oldAgent speaks the first protocol: a Started without caps, and it
// ignores frame types it does not know.
func oldAgent(t *testing.T) (*Client, <-chan []frameSeen) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	seen := make(chan []frameSeen, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, _, err := framing.Read(c); err != nil {
			return
		}
		b, _ := json.Marshal(map[string]int{"pid": 42})
		framing.Write(c, proto.FrameStarted, b)
		var got []frameSeen
		for {
			typ, p, err := framing.Read(c)
			if err != nil {
				seen <- got
				return
			}
			got = append(got, frameSeen{typ, len(p)})
			if typ == proto.FrameStdin && len(p) == 0 {
				b, _ := json.Marshal(proto.Exit{})
				framing.Write(c, proto.FrameExit, b)
			}
		}
	}()
	return &Client{Addr: ln.Addr().String(), Token: testToken}, seen
}

type frameSeen struct {
	typ byte
	n   int
}

// With an agent from before caps: no detach (the caller drops output
// itself), stdin is not held for credit that never comes, and it goes in
// small frames (an old agent queues frames, not bytes).
func TestSessionWithOldAgent(t *testing.T) {
	c, seen := oldAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.Exec(ctx, proto.Request{Argv: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	s.SetDeadline(time.Now().Add(10 * time.Second))
	if s.Detach() {
		t.Error("Detach() = true with an agent that lists no caps, want false")
	}
	const n = 1 << 20
	if err := s.Stdin(make([]byte, n)); err != nil {
		t.Fatalf("Stdin(1 MiB) to an old agent = %v, want nil (no credit to wait for)", err)
	}
	if err := s.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	if typ, _, err := s.Recv(); err != nil || typ != proto.FrameExit {
		t.Fatalf("Recv() = %q, %v; want the exit", typ, err)
	}
	s.Close()
	total := 0
	for _, f := range <-seen {
		if f.typ == proto.FrameDetach {
			t.Errorf("sent FrameDetach to an agent without %q", proto.CapDetach)
		}
		if f.typ == proto.FrameStdin {
			total += f.n
			if f.n > stdinChunk {
				t.Errorf("a stdin frame of %d bytes, want at most %d", f.n, stdinChunk)
			}
		}
	}
	if total != n {
		t.Errorf("the old agent got %d bytes of stdin, want %d", total, n)
	}
}
