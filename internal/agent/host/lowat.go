package host

import (
	"io"
	"net"
	"syscall"
)

// lowatReader reads frames from the agent's TCP connection with as few
// wake-ups and reads as it can, each of which costs context switches that
// were most of the server's CPU for a streaming exec:
//   - while a big payload is under way, the socket's SO_RCVLOWAT is the
//     part still to come (up to lowatMax), so the kernel wakes the reader
//     once per frame instead of once per segment that lands;
//   - small reads (headers, small frames such as stdin credit) are served
//     from one buffered read of whatever has come.
type lowatReader struct {
	c    syscall.RawConn
	r    io.Reader
	cur  int    // the socket's SO_RCVLOWAT as last set (1 is the kernel's default)
	buf  []byte // read ahead by a small read
	head int    // buf[head:] is not yet taken
}

// A read of more than lowatMin is waited for lowatMax at a time at most;
// smaller ones go through a buffer of lowatMin.
const (
	lowatMin = 16 << 10
	lowatMax = 256 << 10
)

func newLowatReader(conn net.Conn) io.Reader {
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return conn
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return conn
	}
	return &lowatReader{c: rc, r: conn, cur: 1, buf: make([]byte, 0, lowatMin)}
}

// want sets SO_RCVLOWAT for a read of n more bytes.
func (l *lowatReader) want(n int) {
	n = min(max(n, 1), lowatMax)
	if n == l.cur {
		return
	}
	l.cur = n
	l.c.Control(func(fd uintptr) {
		syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, n)
	})
}

// Read fills p whole (or fails): callers read a header or a payload.
func (l *lowatReader) Read(p []byte) (int, error) {
	got := copy(p, l.buf[l.head:])
	l.head += got
	for got < len(p) {
		var n int
		var err error
		if len(p)-got > lowatMin {
			l.want(len(p) - got)
			n, err = l.r.Read(p[got:])
		} else {
			// Small: read what has come into the buffer, take from it.
			l.want(1)
			n, err = l.r.Read(l.buf[:cap(l.buf)])
			l.buf, l.head = l.buf[:n], 0
			n = copy(p[got:], l.buf)
			l.head = n
		}
		got += n
		if err != nil {
			if err == io.EOF && got > 0 {
				err = io.ErrUnexpectedEOF
			}
			return got, err
		}
	}
	return got, nil
}
