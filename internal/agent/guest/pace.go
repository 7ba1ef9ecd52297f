package guest

import (
	"time"

	"golang.org/x/sys/unix"
)

// In gVisor, every time one of a sandbox's tasks wakes another (a reader
// waiting on a pipe, a writer waiting for room) costs futex and scheduler
// trips through the Sentry, which on this kind of host cost more than the
// copying. A command writing 100 MiB in 4 KiB writes to a pump that read
// each as it came took 9-13 s of the sandbox's CPU; run alone it takes
// about 2. So the pumps do not wait on the pipes while data flows: they
// let a pipe fill (output) or drain (stdin) to about half for a paced
// while, then move it in one go. A pace adapts to the command's rate, so
// the pipe neither fills up (holding the command) nor is moved in crumbs.
const (
	paceMin = 2 * time.Millisecond  // first wait once data flows; a trickle keeps it
	paceMax = 40 * time.Millisecond // bounds the latency a flowing stream adds
	trickle = 4 << 10               // reads smaller than this are interactive output
)

// pace is the wait between two moves of one pipe.
type pace struct{ d time.Duration }

// afterRead returns how long to let output gather after a read of n bytes
// from a pipe of size bytes; 0 reads again at once.
func (p *pace) afterRead(n, size int) time.Duration {
	switch {
	case n == 0:
		p.d = 0
	case n < trickle:
		p.d = paceMin // a trickle: each bit soon
	case n >= size:
		p.d = max(p.d/2, paceMin) // it filled up: the command may have waited
	case p.d == 0:
		p.d = paceMin
	default:
		// Aim at half a pipe per read, moving at most 4× per step.
		d := time.Duration(float64(p.d) * float64(size/2) / float64(n))
		p.d = min(max(d, p.d/4, paceMin), p.d*4, paceMax)
	}
	return p.d
}

// drained adjusts the wait of a writer to a full pipe of size bytes, given
// the bytes still in it after the last wait.
func (p *pace) drained(left, size int) {
	switch {
	case left == 0:
		p.d = max(p.d/2, paceMin) // it ran dry: the command may have waited
	case left > size/2:
		p.d = min(p.d*2, paceMax) // it hardly moved: look less often
	}
}

// writePaced writes b to fd, the non-blocking write end of a pipe of size
// bytes, waiting between tries for the reader to drain it (see pace). A
// reader that took nothing in the longest wait is not read from at all (a
// command that never reads its stdin, or a background child holding it):
// the rest of b is written blocking, which costs nothing while it waits,
// where looking every paceMax cost a gVisor sandbox ~6% of a CPU each.
// It returns how much of b went in.
func writePaced(fd int, b []byte, size int, p *pace) (int, error) {
	total := len(b)
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if n > 0 {
			b = b[n:]
		}
		switch {
		case err == nil, err == unix.EINTR:
			continue
		case err != unix.EAGAIN:
			return total - len(b), err
		}
		if p.d == 0 {
			p.d = paceMin
		}
		waited := p.d
		time.Sleep(waited)
		left, err := unix.IoctlGetInt(fd, unix.TIOCINQ) // FIONREAD
		if err != nil {
			continue
		}
		if left >= size && waited >= paceMax {
			n, err := writeBlocking(fd, b)
			return total - len(b) + n, err
		}
		p.drained(left, size)
	}
	return total, nil
}

// writeBlocking writes b whole to the non-blocking fd in blocking mode, and
// puts it back. It returns how much of b went in.
func writeBlocking(fd int, b []byte) (int, error) {
	if err := unix.SetNonblock(fd, false); err != nil {
		return 0, err
	}
	defer unix.SetNonblock(fd, true)
	total := len(b)
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if n > 0 {
			b = b[n:]
		}
		if err != nil && err != unix.EINTR {
			return total - len(b), err
		}
	}
	return total, nil
}
