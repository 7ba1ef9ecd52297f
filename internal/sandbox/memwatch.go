package sandbox

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/useshards/shard/internal/agent/host"
	"github.com/useshards/shard/internal/agent/proto"

	"github.com/useshards/shard/internal/oci"
	"github.com/useshards/shard/internal/store"
	"golang.org/x/sys/unix"
)

// The host side of gVisor's OOM guard.
//
// The guard in the agent (internal/agent/guest/oom.go) only looks at memory while
// it moves: every look costs the sandbox syscalls through the Sentry, and a
// guard that polled all the time cost an idle sandbox 6-9% of a core (17-33%
// holding 150 MiB). It watches from boot until memory holds still, then
// sleeps until the host pokes it (mem_check). The host watches the
// sandbox's memory cgroup with the kernel's own notifications, no polling:
// thresholds on memory.usage_in_bytes (cgroup v1 cgroup.event_control),
// from half the bound up to the cgroup's limit, so any growth there crosses
// one; and memory.pressure_level "low", which fires on reclaim, for the
// cgroup that sits full of page cache at its limit (the usage then no
// longer moves while the sandbox's own memory grows into the cache). All
// go to one eventfd per sandbox, read by one goroutine parked in Go's
// netpoller: an idle sandbox costs nothing on either side, and the work
// grows with what sandboxes do, not with how many there are. A poke makes
// the guard watch for a while (it answers how long): events until then
// only leave a note, acted on when that time is up.
type memWatches struct {
	s  *Service // whose runtimes and agents the watches use
	mu sync.Mutex
	m  map[string]*memWatch // sandbox id → its watch; guarded by mu
}

type memWatch struct {
	id     string
	dir    string // the sandbox's memory cgroup
	wakeAt int64  // pokes only while the cgroup holds at least this
	efd    *os.File
	agent  *host.Client
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc

	// Only the watch's goroutine uses these.
	quietUntil time.Time     // the guard is watching until then
	timer      *time.Timer   // wakes the goroutine when that ends, after events came
	backoff    time.Duration // between pokes the agent did not answer
}

// memThresholds are the usages at which the kernel tells us the cgroup
// moved: from half the sandbox's bound to the cgroup's limit (the bound
// plus the Sentry's headroom), a step apart.
func memThresholds(mem, cgroupLimit int64) []int64 {
	step := max(4<<20, mem/16)
	var out []int64
	for t := mem / 2; t < cgroupLimit; t += step {
		out = append(out, t)
	}
	return out
}

// watch starts the host watch of a running gVisor sandbox (once; a
// sandbox already watched is left as it is).
func (w *memWatches) watch(sb *store.Sandbox) {
	if w.s.guest(sb) == nil || sb.MemoryBytes <= 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.m[sb.ID]; ok {
		return
	}
	hostMem, _ := w.s.guest(sb).HostBounds(sb.MemoryBytes, sb.Pids)
	mw, err := newMemWatch(sb, hostMem, w.s.agentFor(sb), w.s.cfg.Log.With("sandbox", sb.ID))
	if err != nil {
		w.s.cfg.Log.Warn("memory watch", "sandbox", sb.ID, "err", err)
		return
	}
	if w.m == nil {
		w.m = map[string]*memWatch{}
	}
	w.m[sb.ID] = mw
	if !w.s.life.goBG(func() {
		mw.run()
		w.mu.Lock()
		if w.m[sb.ID] == mw {
			delete(w.m, sb.ID)
		}
		w.mu.Unlock()
	}) {
		delete(w.m, sb.ID)
		mw.close()
	}
}

// stopAll ends every memory watch (at Close: the sandboxes run on,
// and the next server watches them again).
func (w *memWatches) stopAll() {
	w.mu.Lock()
	all := w.m
	w.m = nil
	w.mu.Unlock()
	for _, mw := range all {
		mw.close()
	}
}

// unwatch ends a sandbox's host watch (at halt).
func (w *memWatches) unwatch(id string) {
	w.mu.Lock()
	mw := w.m[id]
	delete(w.m, id)
	w.mu.Unlock()
	if mw != nil {
		mw.close()
	}
}

// hostMem is the host cgroup's memory bound (provider.Guest.HostBounds).
func newMemWatch(sb *store.Sandbox, hostMem int64, ag *host.Client, log *slog.Logger) (*memWatch, error) {
	dir := "/sys/fs/cgroup/memory" + oci.CgroupsPath(sb.ID)
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	// Non-blocking: reads park in the netpoller, not on a thread.
	f := os.NewFile(uintptr(efd), "memwatch-"+sb.ID)
	ctx, cancel := context.WithCancel(context.Background())
	mw := &memWatch{id: sb.ID, dir: dir, wakeAt: sb.MemoryBytes / 2, efd: f, agent: ag, log: log, ctx: ctx, cancel: cancel}
	if err := mw.register(efd, hostMem, sb.MemoryBytes); err != nil {
		mw.close()
		return nil, err
	}
	mw.note() // a restored guard may be idle in a sandbox that holds much
	return mw, nil
}

// register asks the kernel for the notifications (the registrations go
// when the eventfd is closed, or the cgroup removed).
func (mw *memWatch) register(efd int, cgroupLimit, mem int64) error {
	ctl, err := os.OpenFile(mw.dir+"/cgroup.event_control", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer ctl.Close()
	usage, err := os.Open(mw.dir + "/memory.usage_in_bytes")
	if err != nil {
		return err
	}
	defer usage.Close()
	for _, t := range memThresholds(mem, cgroupLimit) {
		if _, err := fmt.Fprintf(ctl, "%d %d %d", efd, usage.Fd(), t); err != nil {
			return fmt.Errorf("memory threshold: %w", err)
		}
	}
	// Deprecated in cgroup v1 (the kernel says so once) but still there;
	// without it a cgroup full of page cache is watched by thresholds only.
	if pl, err := os.Open(mw.dir + "/memory.pressure_level"); err == nil {
		if _, err := fmt.Fprintf(ctl, "%d %d low", efd, pl.Fd()); err != nil {
			mw.log.Debug("memory pressure notifications unavailable", "err", err)
		}
		pl.Close()
	}
	return nil
}

// note wakes the watch's goroutine as an event would.
func (mw *memWatch) note() {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	mw.efd.Write(one[:]) // an *os.File: never a reused descriptor after close
}

func (mw *memWatch) close() {
	mw.cancel()
	mw.efd.Close()
}

func (mw *memWatch) run() {
	defer func() {
		if mw.timer != nil {
			mw.timer.Stop()
		}
	}()
	var buf [8]byte
	for {
		if _, err := mw.efd.Read(buf[:]); err != nil || mw.ctx.Err() != nil {
			return // closed: the sandbox halted
		}
		if !mw.handle() {
			mw.close()
			return
		}
	}
}

// handle acts on events (any number, coalesced by the eventfd). It
// returns false when the watch should end.
func (mw *memWatch) handle() bool {
	now := time.Now()
	if now.Before(mw.quietUntil) {
		mw.after(mw.quietUntil.Sub(now)) // look again then
		return true
	}
	b, err := os.ReadFile(mw.dir + "/memory.usage_in_bytes")
	if err != nil {
		return false // the cgroup is gone (the kernel signals its removal)
	}
	usage, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if usage < mw.wakeAt {
		return true
	}
	ctx, cancel := context.WithTimeout(mw.ctx, 2*time.Second)
	r, err := mw.agent.Call(ctx, proto.OpMemCheck)
	cancel()
	switch {
	case err == nil && r.WatchMS > 0:
		mw.backoff = 0
		// A little early rather than late: events until then only matter
		// if the guard has stopped watching.
		mw.quietUntil = time.Now().Add(time.Duration(r.WatchMS) * time.Millisecond * 9 / 10)
		return true
	case err == nil, errors.Is(err, host.ErrUnsupported):
		// No guard, or an agent from before mem_check (a sandbox restored
		// from an old checkpoint): it polls on its own.
		mw.log.Debug("memory watch ends: the agent does not take mem_check", "err", err)
		return false
	case mw.ctx.Err() != nil || errors.Is(err, context.Canceled):
		return false
	default:
		// Paused (a warm spare, a fork's freeze) or busy: ask again.
		mw.backoff = min(max(2*mw.backoff, 100*time.Millisecond), 5*time.Second)
		mw.quietUntil = time.Now().Add(mw.backoff)
		mw.after(mw.backoff)
		return true
	}
}

// after wakes the goroutine in d.
func (mw *memWatch) after(d time.Duration) {
	if mw.timer == nil {
		mw.timer = time.AfterFunc(d, mw.note)
		return
	}
	mw.timer.Reset(d)
}
