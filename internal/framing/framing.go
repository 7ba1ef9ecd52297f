// Package framing is the framing of shard's streams: each frame is one type
// byte, a 4-byte big-endian payload length, then the payload. The agent's
// protocol (internal/agent/proto) and the API's binary exec stream
// (docs/exec-stream.md, client.Frame*) are both frames of this kind; what
// the type bytes mean is each protocol's own.
package framing

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
)

// Max bounds a frame's payload so a broken peer cannot make us allocate
// without limit.
const Max = 4 << 20

// Write writes one frame. It is not safe for concurrent use: callers
// serialise writes to one connection.
func Write(w io.Writer, typ byte, payload []byte) error {
	// A small payload goes in the header's buffer, in one write.
	hdr := make([]byte, 5, 5+min(len(payload), smallFrame))
	hdr[0] = typ
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if len(payload) <= smallFrame {
		_, err := w.Write(append(hdr, payload...))
		return err
	}
	// A big payload is not copied: one writev on a connection (atomic
	// with respect to its other writers), two writes elsewhere. Copying
	// megabyte frames into fresh buffers cost more in page faults than
	// anything else on the output path.
	bufs := net.Buffers{hdr, payload}
	_, err := bufs.WriteTo(w)
	return err
}

// smallFrame is the largest payload Write copies to send in one write.
const smallFrame = 4 << 10

// Read reads one frame of at most Max bytes.
func Read(r io.Reader) (byte, []byte, error) { return ReadMax(r, Max) }

// ErrTooBig is what ReadMax returns for a frame past its bound.
type ErrTooBig struct{ Size, Max uint32 }

func (e *ErrTooBig) Error() string {
	return fmt.Sprintf("a frame of %d bytes exceeds the limit of %d", e.Size, e.Max)
}

// ReadMax reads one frame whose payload is at most max bytes.
func ReadMax(r io.Reader, max uint32) (byte, []byte, error) {
	return ReadInto(r, max, nil)
}

// ReadInto is ReadMax reading the payload into buf when it fits
// (a larger one gets a buffer of its own).
func ReadInto(r io.Reader, max uint32, buf []byte) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > max {
		return 0, nil, &ErrTooBig{n, max}
	}
	if n == 0 {
		return hdr[0], nil, nil
	}
	p := buf[:0]
	if uint32(cap(buf)) < n {
		p = make([]byte, n)
	}
	p = p[:n]
	if _, err := io.ReadFull(r, p); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF // the header promised a payload
		}
		return 0, nil, err
	}
	return hdr[0], p, nil
}
