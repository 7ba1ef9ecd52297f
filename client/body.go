package client

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"sync"
	"sync/atomic"
)

// framedBody is a framed exec request body: the request frame, then stdin
// in frames as it comes, then an empty stdin frame (stdin's end). net/http
// sends it through WriteTo, each frame in one write, so the server reads
// whole frames rather than the 32 KiB pieces of a copy through Read (the
// fallback for any other reader of it).
type framedBody struct {
	req  []byte
	in   *coalescer
	once sync.Once
	pr   *io.PipeReader // for Read; made by the first
	// signals, if not nil, are sent as signal frames; the body then stays
	// open past stdin's end, until Close.
	signals   <-chan int
	closed    chan struct{} // closed by Close
	mu        sync.Mutex    // one frame at a time to the writer (stdin's, a signal's)
	closeOnce sync.Once
}

func newFramedBody(req []byte, stdin io.Reader) *framedBody {
	return &framedBody{req: req, in: newCoalescer(stdin), closed: make(chan struct{})}
}

// WriteTo writes the whole body, returning when stdin ends (with signals:
// when the body is closed), or the body is closed: the command ended.
func (b *framedBody) WriteTo(w io.Writer) (int64, error) {
	frame := make([]byte, 5, 5+max(len(b.req), stdinChunk))
	var n atomic.Int64 // a signal frame's write may add to it too
	returned := false  // guarded by b.mu: w is written no more
	defer func() {
		b.mu.Lock()
		returned = true
		b.mu.Unlock()
	}()
	send := func(typ byte, p []byte) error { // p: room for the header, then the payload
		p[0] = typ
		binary.BigEndian.PutUint32(p[1:5], uint32(len(p)-5))
		b.mu.Lock()
		defer b.mu.Unlock()
		if returned {
			return errExecEnded
		}
		m, err := w.Write(p)
		n.Add(int64(m))
		return err
	}
	if err := send(FrameRequest, append(frame[:5], b.req...)); err != nil {
		return n.Load(), err
	}
	if b.signals != nil {
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			for {
				select {
				case sig := <-b.signals:
					p, _ := json.Marshal(ExecSignal{Signal: sig})
					if send(FrameSignal, append(make([]byte, 5, 5+len(p)), p...)) != nil {
						return
					}
				case <-stop:
					return
				}
			}
		}()
	}
	for {
		p, err := b.in.take(frame[:5], stdinChunk)
		if errors.Is(err, errExecEnded) {
			return n.Load(), err
		}
		if len(p) > 5 {
			if werr := send(FrameStdin, p); werr != nil {
				return n.Load(), werr // the exec ended
			}
		}
		if err != nil {
			// EOF or a broken stdin: either way the command's stdin ends.
			if err := send(FrameStdin, frame[:5]); err != nil || b.signals == nil {
				return n.Load(), err
			}
			// The body's end would be the stream's for signals too.
			<-b.closed
			return n.Load(), errExecEnded
		}
	}
}

func (b *framedBody) Read(p []byte) (int, error) {
	b.once.Do(func() {
		pr, pw := io.Pipe()
		b.pr = pr
		go func() {
			_, err := b.WriteTo(pw)
			pw.CloseWithError(err)
		}()
	})
	return b.pr.Read(p)
}

// Close stops the body: stdin is read no further (a Read already waiting
// on it returns in its own time).
func (b *framedBody) Close() error {
	b.closeOnce.Do(func() { close(b.closed) })
	b.in.close()
	b.once.Do(func() {})
	if b.pr != nil {
		b.pr.CloseWithError(errExecEnded)
	}
	return nil
}

// coalescer reads stdin in the background and hands on everything that came
// since the last take, up to a frame's worth. Reading a pipe returns a few
// KiB at a time; sent as they come, such crumbs cost the sandbox a wake-up
// each (100 MiB through `wc -c` took 6 s in 8-64 KiB frames, 2.7 s in
// 128 KiB ones). Input that comes slowly (typing) still goes at once: a
// take waits only while nothing at all has come.
type coalescer struct {
	mu     sync.Mutex
	cond   *sync.Cond
	buf    []byte // read, not yet taken
	err    error  // the read error that ends the input (io.EOF included)
	closed bool   // the taker is gone: the reader stops
}

// coalesceRead is how much one read of stdin asks for.
const coalesceRead = 64 << 10

func newCoalescer(r io.Reader) *coalescer {
	c := &coalescer{buf: make([]byte, 0, stdinChunk)}
	c.cond = sync.NewCond(&c.mu)
	go c.read(r)
	return c
}

func (c *coalescer) read(r io.Reader) {
	tmp := make([]byte, coalesceRead)
	for {
		n, err := r.Read(tmp)
		c.mu.Lock()
		// Bounded: the reader waits while a whole frame is waiting.
		for len(c.buf) >= stdinChunk && !c.closed {
			c.cond.Wait()
		}
		if c.closed {
			c.mu.Unlock()
			return
		}
		c.buf = append(c.buf, tmp[:n]...)
		c.err = err
		c.cond.Broadcast()
		c.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// take appends to dst what came, at most max bytes, waiting until something
// did or the input ended; err is set (with nothing more to come) at the end.
func (c *coalescer) take(dst []byte, max int) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.buf) == 0 && c.err == nil && !c.closed {
		c.cond.Wait()
	}
	if c.closed {
		return dst, errExecEnded
	}
	n := min(len(c.buf), max)
	dst = append(dst, c.buf[:n]...)
	c.buf = c.buf[:copy(c.buf, c.buf[n:])]
	c.cond.Broadcast()
	if len(c.buf) > 0 {
		return dst, nil
	}
	return dst, c.err
}

// close stops the reader (after its read in progress, which may never end).
func (c *coalescer) close() {
	c.mu.Lock()
	c.closed = true
	c.cond.Broadcast()
	c.mu.Unlock()
}
