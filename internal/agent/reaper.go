package agent

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
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
}

func newReaper() *reaper {
	return &reaper{waiters: make(map[int]chan<- syscall.WaitStatus)}
}

func (r *reaper) start(path string, argv []string, attr *os.ProcAttr, done chan<- syscall.WaitStatus) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, err := os.StartProcess(path, argv, attr)
	if err != nil {
		return 0, err
	}
	pid := p.Pid
	p.Release()
	r.waiters[pid] = done
	return pid, nil
}

func (r *reaper) run() {
	sig := make(chan os.Signal, 16)
	signal.Notify(sig, syscall.SIGCHLD)
	tick := time.NewTicker(time.Second) // SIGCHLDs coalesce; never miss one
	defer tick.Stop()
	for {
		r.reap()
		select {
		case <-sig:
		case <-tick.C:
		}
	}
}

func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		if ch, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			ch <- ws // buffered
		}
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
