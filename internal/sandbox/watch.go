package sandbox

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/store"
	"golang.org/x/sys/unix"
)

// watcher notices sandboxes that end without being asked to: the host's OOM
// killer taking a gVisor Sentry, a crash, a kill from outside. It holds a
// pidfd of the runtime's host process of every running sandbox in one epoll
// set, and one goroutine waits on it: an idle server does no work at all,
// however many sandboxes it holds, and a death is seen at once (then the
// sandbox is marked failed with the reason, its execs end, and its mounts
// and network go; its files stay, and `shard start` boots it again).
type watcher struct {
	s    *Service // whose sandboxes it watches, and marks dead
	epfd int      // -1 once Watch returned; guarded by mu after ready

	mu    sync.Mutex
	byFD  map[int32]watched  // pidfd → what it watches; guarded by mu
	byID  map[string]watched // sandbox id → its pidfd; guarded by mu
	ready chan struct{}      // closed once epfd is made
}

type watched struct {
	id  string
	pid int
	fd  int
}

// Watch runs the watcher until ctx ends.
func (s *Service) Watch(ctx context.Context) {
	w := s.watch
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		s.cfg.Log.Error("watcher: epoll", "err", err)
		return
	}
	// epoll_wait blocks a thread, and closing epfd does not wake it: an
	// eventfd in the set, written when ctx ends, does.
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err == nil {
		err = unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wake)})
	}
	if err != nil {
		unix.Close(epfd)
		s.cfg.Log.Error("watcher: eventfd", "err", err)
		return
	}
	w.mu.Lock()
	w.epfd = epfd
	w.mu.Unlock()
	close(w.ready)
	defer func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		for fd := range w.byFD {
			unix.Close(int(fd))
		}
		clear(w.byFD)
		clear(w.byID)
		unix.Close(epfd)
		unix.Close(wake)
		w.epfd = -1
	}()
	ctx = project.Unscoped(ctx, "the watcher: sandboxes of every project that end on their own")
	// Every sandbox that runs now; later ones are added as they start.
	if all, err := s.cfg.Store.ListSandboxes(ctx); err == nil {
		for _, sb := range all {
			if sb.State == StateRunning {
				s.watch.watchSandbox(sb.ID)
			}
		}
	}
	stop := context.AfterFunc(ctx, func() { unix.Write(wake, []byte{1, 0, 0, 0, 0, 0, 0, 0}) })
	defer stop()
	evs := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(epfd, evs, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			s.cfg.Log.Error("watcher: epoll_wait", "err", err)
			return
		}
		for _, ev := range evs[:n] {
			if ev.Fd == int32(wake) {
				return // ctx ended: the server is shutting down
			}
			w.mu.Lock()
			wd, ok := w.byFD[ev.Fd]
			if ok {
				delete(w.byFD, ev.Fd)
				if w.byID[wd.id].fd == wd.fd {
					delete(w.byID, wd.id)
				}
			}
			w.mu.Unlock()
			if !ok {
				continue
			}
			unix.EpollCtl(epfd, unix.EPOLL_CTL_DEL, wd.fd, nil)
			unix.Close(wd.fd)
			s.life.goBG(func() { s.watch.markDead(context.WithoutCancel(ctx), wd.id, wd.pid) })
		}
	}
}

func newWatcher(s *Service) *watcher {
	return &watcher{s: s, byFD: map[int32]watched{}, byID: map[string]watched{}, ready: make(chan struct{})}
}

// watchSandbox starts watching sandbox id's runtime process, in the
// background (finding the pid asks the runtime: a process per look, which a
// create or fork must not wait for).
func (w *watcher) watchSandbox(id string) {
	w.s.life.goBG(func() {
		select {
		case <-w.ready:
		case <-w.s.life.Done():
			return
		}
		w.mu.Lock()
		_, known := w.byID[id] // a thawed source: its process is the same
		w.mu.Unlock()
		if known {
			return
		}
		ctx := project.Unscoped(context.Background(), "the watcher: a sandbox of any project that starts to run")
		sb, err := w.s.cfg.Store.GetSandbox(ctx, id)
		if err != nil || sb.State != StateRunning {
			return
		}
		w.s.mem.watch(sb)
		pider, ok := w.s.providers[sb.Provider].(provider.PIDer)
		if !ok {
			return
		}
		var pid int
		for try := 0; try < 5 && !w.s.life.stopping(); try++ {
			// Bounded: a Sentry that cannot answer (stopped from outside)
			// holds runsc, and runsc holds the runtime's lock on the
			// sandbox, which a stop of it waits for.
			c, cancel := context.WithTimeout(ctx, runtimeCallTimeout)
			pid, err = pider.InitPID(c, id)
			cancel()
			if err == nil {
				break
			}
			time.Sleep(time.Duration(try+1) * 200 * time.Millisecond)
		}
		if err != nil {
			// The runtime does not know it: it may have ended already.
			w.markDead(ctx, id, 0)
			return
		}
		w.watchPID(id, pid)
	})
}

// watchPID adds pid, sandbox id's runtime process, to the epoll set.
func (w *watcher) watchPID(id string, pid int) {
	w.mu.Lock()
	if old, ok := w.byID[id]; ok {
		if old.pid == pid {
			w.mu.Unlock()
			return
		}
		delete(w.byFD, int32(old.fd))
		delete(w.byID, id)
		if w.epfd >= 0 {
			unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, old.fd, nil)
			unix.Close(old.fd)
		}
	}
	w.mu.Unlock()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			w.markDead(project.Unscoped(context.Background(), "the watcher: a sandbox of any project that ended"), id, pid) // gone already
		} else {
			w.s.cfg.Log.Warn("watcher: pidfd", "sandbox", id, "pid", pid, "err", err)
		}
		return
	}
	unix.CloseOnExec(fd)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.epfd < 0 {
		unix.Close(fd) // the watcher ended: the server is shutting down
		return
	}
	wd := watched{id: id, pid: pid, fd: fd}
	w.byFD[int32(fd)] = wd
	w.byID[id] = wd
	// A pidfd polls readable once its process has ended.
	if err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
		delete(w.byFD, int32(fd))
		delete(w.byID, id)
		unix.Close(fd)
		w.s.cfg.Log.Warn("watcher: epoll add", "sandbox", id, "err", err)
	}
}

// processAlive: the pid exists and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// The state is the field after the parenthesised command name.
	if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] != 'Z' && b[i+2] != 'X'
	}
	return true
}

// markDead records that sandbox id ended on its own, if it is still meant
// to run and its runtime agrees it does not (pid is the process that
// ended; 0 when unknown).
func (w *watcher) markDead(ctx context.Context, id string, pid int) {
	unlock := w.s.locks.lock(id)
	defer unlock()
	cur, err := w.s.cfg.Store.GetSandbox(ctx, id)
	if err != nil || cur.State != StateRunning {
		return // a stop, remove or fork got there first
	}
	sctx, cancel := context.WithTimeout(ctx, runtimeCallTimeout)
	st, err := w.s.providers[cur.Provider].Status(sctx, cur.ID)
	cancel()
	if err != nil || st == provider.StatusRunning || st == provider.StatusPaused {
		// It runs (started again under another pid): watch that one. Or
		// the runtime cannot say: never kill what may run.
		if err == nil {
			w.watchSandbox(cur.ID)
		}
		return
	}
	ooms := w.s.halt(ctx, cur, false)
	reason := "the sandbox ended on its own (its runtime process is gone)"
	if ooms > 0 {
		reason = "the sandbox ran out of memory and the host killed it"
	}
	w.s.execs.end(cur.ID, "sandbox "+cur.Name+" ended while the command ran: "+reason)
	w.s.cfg.Log.Warn("sandbox died", "sandbox", cur.ID, "name", cur.Name, "pid", pid, "reason", reason)
	w.s.cfg.Store.UpdateSandbox(ctx, cur.ID, func(r *store.Sandbox) (*store.EventSpec, error) {
		r.State, r.StoppedAt, r.Error = StateFailed, time.Now().UTC(), reason
		r.OOMKills += ooms
		return &store.EventSpec{Type: ledger.Failed, Data: ledger.EndedData{Reason: reason}}, nil
	})
}
