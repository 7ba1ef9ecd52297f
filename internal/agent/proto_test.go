package agent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestFrameRoundTrip(t *testing.T) {
	tests := []struct {
		name    string
		typ     byte
		payload []byte
	}{
		{"empty", FrameStdin, nil},
		{"zero-length non-nil", FrameStdin, []byte{}},
		{"one byte", FrameStdout, []byte("x")},
		{"json", FrameRequest, []byte(`{"token":"t","op":"ping"}`)},
		{"binary", FrameStderr, []byte{0, 1, 2, 0xff, 0xfe, 0}},
		{"64KiB", FrameStdout, bytes.Repeat([]byte("ab"), 32<<10)},
		{"exactly MaxFrame", FrameStdout, bytes.Repeat([]byte{'z'}, MaxFrame)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteFrame(&buf, tt.typ, tt.payload); err != nil {
				t.Fatalf("WriteFrame(%q, %d bytes) = %v, want nil", tt.typ, len(tt.payload), err)
			}
			if got, want := buf.Len(), 5+len(tt.payload); got != want {
				t.Errorf("WriteFrame(%q, %d bytes) wrote %d bytes, want %d", tt.typ, len(tt.payload), got, want)
			}
			typ, p, err := ReadFrame(&buf)
			if err != nil {
				t.Fatalf("ReadFrame() error = %v, want nil", err)
			}
			if typ != tt.typ {
				t.Errorf("ReadFrame() type = %q, want %q", typ, tt.typ)
			}
			if !bytes.Equal(p, tt.payload) {
				t.Errorf("ReadFrame() payload = %d bytes, want %d bytes (equal content)", len(p), len(tt.payload))
			}
			if len(tt.payload) == 0 && p != nil {
				t.Errorf("ReadFrame() of an empty frame = %q, want nil payload", p)
			}
			if buf.Len() != 0 {
				t.Errorf("ReadFrame() left %d bytes unread, want 0", buf.Len())
			}
		})
	}
}

func TestFrameSequence(t *testing.T) {
	frames := []struct {
		typ byte
		p   string
	}{
		{FrameStarted, `{"pid":7}`},
		{FrameStdout, "out\n"},
		{FrameStdin, ""},
		{FrameStderr, "err\n"},
		{FrameExit, `{"exit_code":3}`},
	}
	var buf bytes.Buffer
	for _, f := range frames {
		if err := WriteFrame(&buf, f.typ, []byte(f.p)); err != nil {
			t.Fatalf("WriteFrame(%q, %q) = %v", f.typ, f.p, err)
		}
	}
	for i, f := range frames {
		typ, p, err := ReadFrame(&buf)
		if err != nil || typ != f.typ || string(p) != f.p {
			t.Errorf("frame %d: ReadFrame() = %q, %q, %v; want %q, %q, nil", i, typ, p, err, f.typ, f.p)
		}
	}
	if _, _, err := ReadFrame(&buf); err != io.EOF {
		t.Errorf("ReadFrame() at the end = %v, want io.EOF", err)
	}
}

func header(typ byte, n uint32) []byte {
	h := make([]byte, 5)
	h[0] = typ
	binary.BigEndian.PutUint32(h[1:], n)
	return h
}

func TestReadFrameErrors(t *testing.T) {
	tests := []struct {
		name    string
		in      []byte
		wantErr error  // matched with errors.Is, if set
		wantMsg string // substring of the error, if set
	}{
		{"empty stream", nil, io.EOF, ""},
		{"short header", []byte{FrameStdout, 0, 0}, io.ErrUnexpectedEOF, ""},
		{"short payload", append(header(FrameStdout, 10), "abc"...), io.ErrUnexpectedEOF, ""},
		{"header only, payload missing", header(FrameStdout, 1), io.ErrUnexpectedEOF, ""},
		{"MaxFrame+1", header(FrameStdout, MaxFrame+1), nil, "exceeds the limit"},
		{"4 GiB", header(FrameStdout, 0xffffffff), nil, "exceeds the limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			typ, p, err := ReadFrame(bytes.NewReader(tt.in))
			if err == nil {
				t.Fatalf("ReadFrame(%q) = %q, %d bytes, nil; want an error", tt.in, typ, len(p))
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("ReadFrame(%q) error = %v, want %v", tt.in, err, tt.wantErr)
			}
			if tt.wantMsg != "" && !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("ReadFrame(%q) error = %q, want it to mention %q", tt.in, err, tt.wantMsg)
			}
			if p != nil {
				t.Errorf("ReadFrame(%q) payload = %q on error, want nil", tt.in, p)
			}
		})
	}
}

// A frame over the bound must be refused from the header alone: the reader
// must not try to read (or allocate) the payload.
func TestReadFrameOverLimitReadsOnlyHeader(t *testing.T) {
	r := bytes.NewReader(append(header(FrameStdout, MaxFrame+1), "rest"...))
	if _, _, err := ReadFrame(r); err == nil {
		t.Fatal("ReadFrame(MaxFrame+1) = nil error, want one")
	}
	if got := r.Len(); got != len("rest") {
		t.Errorf("ReadFrame(MaxFrame+1) consumed the payload: %d bytes left, want %d", got, len("rest"))
	}
}

type errWriter struct{ err error }

func (w errWriter) Write([]byte) (int, error) { return 0, w.err }

func TestWriteFrameError(t *testing.T) {
	boom := errors.New("boom")
	for _, p := range [][]byte{nil, []byte("data")} {
		if err := WriteFrame(errWriter{boom}, FrameStdout, p); !errors.Is(err, boom) {
			t.Errorf("WriteFrame(failing writer, %q) = %v, want %v", p, err, boom)
		}
	}
}

// Each frame is one Write, so frames written by different goroutines under a
// mutex (or by a packet-oriented writer) never interleave.
type countWriter struct {
	writes int
	bytes.Buffer
}

func (w *countWriter) Write(p []byte) (int, error) {
	w.writes++
	return w.Buffer.Write(p)
}

func TestWriteFrameSingleWrite(t *testing.T) {
	for _, p := range [][]byte{nil, []byte("hello")} {
		var w countWriter
		if err := WriteFrame(&w, FrameStdout, p); err != nil {
			t.Fatalf("WriteFrame(%q) = %v", p, err)
		}
		if w.writes != 1 {
			t.Errorf("WriteFrame(%q) made %d writes, want 1", p, w.writes)
		}
	}
}

// waitTail ends when the output is drained, and otherwise only after the
// pumps spent tailQuiet not held up by the client nor leaving output in the
// pipes (that up to tailPending): a slow client holds it (so nothing
// written before the exit is cut), a quiet background child does not. Once
// every writer is gone (hup) it waits for drained, however long that takes.
// Counted in looks at the pumps, not in wall time.
func TestWaitTail(t *testing.T) {
	drained := make(chan struct{})
	close(drained)
	var looks atomic.Int32
	yes := func() bool { return true }
	no := func() bool { return false }
	if cut := waitTail(drained, func() bool { looks.Add(1); return true }, yes, no); cut || looks.Load() > 1 {
		t.Errorf("drained: looked at the pumps %d times (cut %v), want it to end at once, not cut", looks.Load(), cut)
	}

	quietLooks := int32(tailQuiet / tailTick)
	pendingLooks := int32(tailPending / tailTick)
	for _, tt := range []struct {
		name       string
		sendingFor int32 // looks
		pendingFor int32 // looks
		want       int32
	}{
		{"quiet at once", 0, 0, quietLooks},
		{"sending 1", 1, 0, 1 + quietLooks},
		{"sending 30", 30, 0, 30 + quietLooks},
		{"output left in a pipe for 20 looks", 0, 20, 20 + quietLooks},
		// A pipe never empty (a background writer): waited for up to
		// tailPending, then the quiet rule alone.
		{"output left for ever", 0, 1 << 30, pendingLooks - 1 + quietLooks},
	} {
		looks.Store(0)
		var pl atomic.Int32
		pending := func() bool { return pl.Add(1) <= tt.pendingFor }
		if tt.pendingFor == 0 {
			pending = no
		}
		cut := waitTail(make(chan struct{}), func() bool { return looks.Add(1) <= tt.sendingFor }, pending, no)
		if got := looks.Load(); got != tt.want || !cut {
			t.Errorf("%s: waited %d looks (cut %v), want %d, cut", tt.name, got, cut, tt.want)
		}
	}

	// Every writer gone: it waits for drained past the quiet bound.
	late := make(chan struct{})
	go func() { time.Sleep(tailQuiet * 3); close(late) }()
	start := time.Now()
	if cut := waitTail(late, no, no, yes); cut || time.Since(start) < tailQuiet*3 {
		t.Errorf("hup: returned after %v (cut %v), want it to wait for drained (%v), not cut", time.Since(start), cut, tailQuiet*3)
	}
}
