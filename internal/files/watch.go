package files

import (
	"context"
	"errors"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// WatchOutput returns a context that is cancelled once fd, the pipe (or
// socket) the helper writes its answer to, has no reader left: poll reports
// POLLERR (a pipe's reader closed) or POLLHUP (a socket's). A read that
// writes nothing for minutes (Scan of a huge file) stops then, where a
// write's EPIPE would come only once it is done: the server gives up on a
// helper by closing the pipe, and its SIGTERM reaches the runtime's exec on
// the host, not the helper inside a gVisor sandbox. fd is asked again
// every interval, which does not rely on the sandbox's kernel waking a
// poll for an event it was not asked (no events are asked: a pipe with
// room is always writable).
func WatchOutput(ctx context.Context, fd int, interval time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		ms := int(interval / time.Millisecond)
		for ctx.Err() == nil {
			pfd := []unix.PollFd{{Fd: int32(fd)}}
			n, err := unix.Poll(pfd, ms)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil {
				return // it cannot be watched: the read ends as it would have
			}
			if n > 0 && pfd[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
				cancel()
				return
			}
			if n > 0 {
				// An answer for no event asked for: not a wait.
				time.Sleep(interval)
			}
		}
	}()
	return ctx, cancel
}
