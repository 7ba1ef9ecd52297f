package host

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"slices"
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

// replyAgent answers every op with reply(req), as an agent of any version
// would.
func replyAgent(t *testing.T, reply func(proto.Request) proto.Reply) *Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				_, p, err := framing.Read(c)
				if err != nil {
					return
				}
				var req proto.Request
				json.Unmarshal(p, &req)
				b, _ := json.Marshal(reply(req))
				framing.Write(c, proto.FrameReply, b)
			}()
		}
	}()
	return &Client{Addr: ln.Addr().String(), Token: testToken}
}

// An op the agent does not have is ErrUnsupported, whether the agent says
// so in its field or, from before the field, in its words; other refusals
// are not.
func TestDoUnsupported(t *testing.T) {
	tests := []struct {
		name  string
		reply proto.Reply
		want  bool // ErrUnsupported
	}{
		{"marked", proto.Reply{Error: "unknown op grant_file", UnknownOp: true}, true},
		{"marked, other words", proto.Reply{Error: "no such op", UnknownOp: true}, true},
		{"an agent from before the field", proto.Reply{Error: "unknown op grant_file"}, true},
		{"the words of another op", proto.Reply{Error: "unknown op put_file"}, false},
		{"a refusal with a code", proto.Reply{Error: "/x exists", Code: proto.CodePathExists}, false},
		{"a failure", proto.Reply{Error: "input/output error"}, false},
		{"done", proto.Reply{OK: true}, false},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := replyAgent(t, func(proto.Request) proto.Reply { return tt.reply })
			r, err := c.Do(ctx, proto.Request{Op: proto.OpGrantFile})
			if got := errors.Is(err, ErrUnsupported); got != tt.want {
				t.Errorf("Do(grant_file) answered %+v = %v; ErrUnsupported %v, want %v", tt.reply, err, got, tt.want)
			}
			if r == nil || r.Error != tt.reply.Error {
				t.Errorf("Do(grant_file) reply = %+v, want the agent's", r)
			}
		})
	}
}

// Caps is what the agent lists; an agent that lists none (from before caps)
// has LegacyCaps.
func TestCaps(t *testing.T) {
	tests := []struct {
		name  string
		reply proto.Reply
		want  proto.Caps
	}{
		{"listed", proto.Reply{OK: true, Caps: proto.Caps{proto.CapDetach, proto.CapForked}}, proto.Caps{proto.CapDetach, proto.CapForked}},
		{"none: from before caps", proto.Reply{OK: true}, proto.LegacyCaps},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ops := make(chan string, 1)
			c := replyAgent(t, func(req proto.Request) proto.Reply { ops <- req.Op; return tt.reply })
			got, err := c.Caps(ctx)
			if op := <-ops; err != nil || !slices.Equal(got, tt.want) || op != proto.OpPing {
				t.Errorf("Caps() = %q, %v after op %q; want %q after a ping", got, err, op, tt.want)
			}
		})
	}
	c := replyAgent(t, func(proto.Request) proto.Reply { return proto.Reply{Error: "bad token"} })
	if _, err := c.Caps(ctx); err == nil {
		t.Error("Caps() of an agent that refuses the ping = nil error, want one")
	}
}
