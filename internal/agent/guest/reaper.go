package guest

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// reaper is the agent's child reaper. As PID 1 the agent inherits every
// orphan in the sandbox, so it must wait for all of them; the commands it
// started are waited for by the same loop, which hands their status on.
//
// start holds mu across the spawn and the registration, so a child that
// exits at once is never reaped before its waiter is known.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan<- syscall.WaitStatus // guarded by mu
	// spawn starts a process: os.StartProcess, or the pids-bounded
	// spawner's (see bounds.go). Set before the first start.
	spawn func(path string, argv []string, attr *os.ProcAttr) (*os.Process, error)
}

func newReaper() *reaper {
	return &reaper{waiters: make(map[int]chan<- syscall.WaitStatus), spawn: os.StartProcess}
}

func (r *reaper) start(path string, argv []string, attr *os.ProcAttr, done chan<- syscall.WaitStatus) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, err := r.spawn(path, argv, attr)
	if err != nil {
		return 0, err
	}
	pid := p.Pid
	p.Release()
	r.waiters[pid] = done
	return pid, nil
}

// run reaps on every SIGCHLD, and nothing else wakes it (no timer: inside
// gVisor every wake-up costs syscalls through the Sentry). No child is
// missed: SIGCHLDs coalesce, but each reap waits for children until none is
// left to wait for, and a SIGCHLD that comes while it does (or while the
// channel is full) leaves one in the channel, so the loop reaps again.
func (r *reaper) run() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGCHLD)
	for {
		r.reap()
		<-sig
	}
}

// reap waits for every child that has ended. It holds mu for one child at a
// time, not for the whole round: under a fork bomb, orphans end as fast as
// they are reaped, and a round that held mu throughout starved start (no
// command could start to kill the bomb).
func (r *reaper) reap() {
	for r.reapOne() {
	}
}

// reapOne waits for one ended child and hands its status to its waiter; it
// reports whether there was one.
func (r *reaper) reapOne() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return false
		}
		if ch, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			ch <- ws // buffered
		}
		return true
	}
}

// others reports whether any process besides the agent is still alive.
func (r *reaper) others() bool {
	r.reap()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	self := os.Getpid()
	for _, e := range ents {
		pid := 0
		for _, c := range e.Name() {
			if c < '0' || c > '9' {
				pid = -1
				break
			}
			pid = pid*10 + int(c-'0')
		}
		if pid > 0 && pid != self {
			return true
		}
	}
	return false
}
