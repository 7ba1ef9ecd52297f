package sandbox

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/useshards/shard/internal/agent/host"
	"github.com/useshards/shard/internal/agent/proto"
	"github.com/useshards/shard/internal/framing"

	"github.com/useshards/shard/internal/provider/gvisor"
)

func TestMemThresholds(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		mem       int64
		wantFirst int64
		wantN     int
	}{
		{256 * mib, 128 * mib, 12},       // 128..304 by 16 MiB, under 320 MiB
		{64 * mib, 32 * mib, 24},         // 32..124 by 4 MiB, under 128 MiB
		{16 << 30, 8 << 30, 12},          // 8..19 GiB by 1 GiB, under 20 GiB
		{8 * mib, 4 * mib, (72 - 4) / 4}, // the 4 MiB step floor
	}
	for _, tt := range tests {
		limit := gvisor.CgroupLimit(tt.mem)
		got := memThresholds(tt.mem, limit)
		if len(got) != tt.wantN || got[0] != tt.wantFirst || got[len(got)-1] >= limit {
			t.Errorf("memThresholds(%d MiB, %d MiB) = %d thresholds from %d MiB to %d MiB; want %d from %d MiB, all under the limit",
				tt.mem/mib, limit/mib, len(got), got[0]/mib, got[len(got)-1]/mib, tt.wantN, tt.wantFirst/mib)
		}
	}
}

// fakeAgent answers every request with reply, whatever the token, and
// counts the ops.
type fakeAgent struct {
	ln    net.Listener
	reply proto.Reply
	mu    sync.Mutex
	ops   []string
}

func newFakeAgent(t *testing.T, reply proto.Reply) *fakeAgent {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeAgent{ln: ln, reply: reply}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.SetDeadline(time.Now().Add(10 * time.Second)) // a caller that sends nothing holds no one up for long
			_, p, err := framing.Read(c)
			if err == nil {
				var req proto.Request
				json.Unmarshal(p, &req)
				f.mu.Lock()
				f.ops = append(f.ops, req.Op)
				f.mu.Unlock()
				b, _ := json.Marshal(f.reply)
				framing.Write(c, proto.FrameReply, b)
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return f
}

func (f *fakeAgent) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.ops)
}

// A memWatch over a fake cgroup directory and a fake agent.
func testMemWatch(t *testing.T, f *fakeAgent, usage int64) (*memWatch, func(int64)) {
	dir := t.TempDir()
	set := func(u int64) {
		if err := os.WriteFile(filepath.Join(dir, "memory.usage_in_bytes"), []byte(strconv.FormatInt(u, 10)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	set(usage)
	r, w, err := os.Pipe() // stands in for the eventfd: note() writes, nobody reads
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	ctx, cancel := context.WithCancel(own())
	mw := &memWatch{id: "x", dir: dir, wakeAt: 100, efd: w, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		agent: &host.Client{Addr: f.ln.Addr().String(), Token: "t"}, ctx: ctx, cancel: cancel}
	t.Cleanup(mw.close)
	return mw, set
}

// The host pokes the guard only when the cgroup holds at least half the
// bound, then leaves it alone while it says it watches.
func TestMemWatchPokes(t *testing.T) {
	f := newFakeAgent(t, proto.Reply{OK: true, WatchMS: 60_000})
	mw, set := testMemWatch(t, f, 50)
	if !mw.handle() || f.calls() != 0 {
		t.Fatalf("usage under half the bound: handle() poked %d times, want 0", f.calls())
	}
	set(150)
	if !mw.handle() || f.calls() != 1 {
		t.Fatalf("usage past half the bound: handle() poked %d times, want 1", f.calls())
	}
	if !mw.handle() || f.calls() != 1 {
		t.Fatalf("an event while the guard watches: handle() poked %d times, want still 1", f.calls())
	}
	if mw.timer == nil {
		t.Errorf("an event while the guard watches left no wake-up for when it stops")
	}
	mw.quietUntil = time.Now().Add(-time.Millisecond) // the watch is over
	if !mw.handle() || f.calls() != 2 {
		t.Fatalf("an event after the guard's watch: handle() poked %d times, want 2", f.calls())
	}
}

// An agent from before mem_check (restored from an old checkpoint) polls on
// its own: the watch ends. So does it when the cgroup is gone.
func TestMemWatchEnds(t *testing.T) {
	for _, reply := range []proto.Reply{
		{Error: "unknown op " + proto.OpMemCheck, UnknownOp: true},
		{Error: "unknown op " + proto.OpMemCheck}, // an agent from before UnknownOp
	} {
		old := newFakeAgent(t, reply)
		mw, _ := testMemWatch(t, old, 150)
		if mw.handle() {
			t.Errorf("handle() with an agent that does not know mem_check (%+v) = true, want false (the watch ends)", reply)
		}
	}
	f := newFakeAgent(t, proto.Reply{OK: true, WatchMS: 1000})
	mw, _ := testMemWatch(t, f, 150)
	os.Remove(filepath.Join(mw.dir, "memory.usage_in_bytes"))
	if mw.handle() {
		t.Errorf("handle() with the cgroup gone = true, want false")
	}
}
