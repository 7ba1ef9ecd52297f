package client

import (
	"encoding/binary"
	"fmt"
	"io"
)

// StreamMediaType is the binary exec stream (docs/exec-stream.md): both
// ways a sequence of frames, each a type byte, a 4-byte big-endian payload
// length and the payload. An exec's output comes as it is, with no base64
// and no JSON per chunk.
const StreamMediaType = "application/vnd.shard.stream"

// Frame types of the binary exec stream.
const (
	// Server to client.
	FrameStarted byte = 'S' // JSON {"pid": N}
	FrameStdout  byte = 'O' // raw bytes
	FrameStderr  byte = 'E' // raw bytes
	FrameExit    byte = 'X' // JSON ExecExit: exit_code, signal, timed_out, oom_killed, error, stdin/stdout/stderr_bytes; the last frame
	FrameError   byte = 'F' // JSON Error: the stream lost the sandbox; the last frame

	// Client to server, in a framed request body.
	FrameRequest byte = 'Q' // JSON ExecRequest, without stdin; the first frame
	FrameStdin   byte = 'I' // raw bytes; an empty payload closes stdin
	FrameSignal  byte = 'K' // JSON {"signal": N}
	FrameResize  byte = 'R' // JSON {"rows": N, "cols": N}
)

// maxServerFrame bounds a frame from the server, so a broken one cannot
// make the client allocate without limit.
const maxServerFrame = 4 << 20

// stdinChunk is how much stdin one frame carries (a client frame is at most
// 1 MiB).
const stdinChunk = 256 << 10

func writeFrame(w io.Writer, typ byte, p []byte) error {
	var hdr [5]byte
	hdr[0] = typ
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(p)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	if len(p) == 0 {
		return nil
	}
	_, err := w.Write(p)
	return err
}

// frameReader reads frames, reusing its buffer: a payload is valid until
// the next call.
type frameReader struct {
	r   io.Reader
	hdr [5]byte
	buf []byte
}

func (f *frameReader) next() (byte, []byte, error) {
	if _, err := io.ReadFull(f.r, f.hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(f.hdr[1:])
	if n > maxServerFrame {
		return 0, nil, fmt.Errorf("exec stream: a frame of %d bytes exceeds the limit of %d", n, maxServerFrame)
	}
	if cap(f.buf) < int(n) {
		f.buf = make([]byte, n)
	}
	p := f.buf[:n]
	if _, err := io.ReadFull(f.r, p); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return f.hdr[0], p, nil
}
