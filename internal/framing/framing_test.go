package framing

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
)

// Frame types for the tests (the agent's: what a type means is each
// protocol's own).
const (
	FrameRequest byte = 'Q'
	FrameStdin   byte = 'I'
	FrameStarted byte = 'S'
	FrameStdout  byte = 'O'
	FrameStderr  byte = 'E'
	FrameExit    byte = 'X'
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
		{"exactly Max", FrameStdout, bytes.Repeat([]byte{'z'}, Max)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := Write(&buf, tt.typ, tt.payload); err != nil {
				t.Fatalf("Write(%q, %d bytes) = %v, want nil", tt.typ, len(tt.payload), err)
			}
			if got, want := buf.Len(), 5+len(tt.payload); got != want {
				t.Errorf("Write(%q, %d bytes) wrote %d bytes, want %d", tt.typ, len(tt.payload), got, want)
			}
			typ, p, err := Read(&buf)
			if err != nil {
				t.Fatalf("Read() error = %v, want nil", err)
			}
			if typ != tt.typ {
				t.Errorf("Read() type = %q, want %q", typ, tt.typ)
			}
			if !bytes.Equal(p, tt.payload) {
				t.Errorf("Read() payload = %d bytes, want %d bytes (equal content)", len(p), len(tt.payload))
			}
			if len(tt.payload) == 0 && p != nil {
				t.Errorf("Read() of an empty frame = %q, want nil payload", p)
			}
			if buf.Len() != 0 {
				t.Errorf("Read() left %d bytes unread, want 0", buf.Len())
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
		if err := Write(&buf, f.typ, []byte(f.p)); err != nil {
			t.Fatalf("Write(%q, %q) = %v", f.typ, f.p, err)
		}
	}
	for i, f := range frames {
		typ, p, err := Read(&buf)
		if err != nil || typ != f.typ || string(p) != f.p {
			t.Errorf("frame %d: Read() = %q, %q, %v; want %q, %q, nil", i, typ, p, err, f.typ, f.p)
		}
	}
	if _, _, err := Read(&buf); err != io.EOF {
		t.Errorf("Read() at the end = %v, want io.EOF", err)
	}
}

func header(typ byte, n uint32) []byte {
	h := make([]byte, 5)
	h[0] = typ
	binary.BigEndian.PutUint32(h[1:], n)
	return h
}

func TestReadErrors(t *testing.T) {
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
		{"Max+1", header(FrameStdout, Max+1), nil, "exceeds the limit"},
		{"4 GiB", header(FrameStdout, 0xffffffff), nil, "exceeds the limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			typ, p, err := Read(bytes.NewReader(tt.in))
			if err == nil {
				t.Fatalf("Read(%q) = %q, %d bytes, nil; want an error", tt.in, typ, len(p))
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("Read(%q) error = %v, want %v", tt.in, err, tt.wantErr)
			}
			if tt.wantMsg != "" && !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Read(%q) error = %q, want it to mention %q", tt.in, err, tt.wantMsg)
			}
			if p != nil {
				t.Errorf("Read(%q) payload = %q on error, want nil", tt.in, p)
			}
		})
	}
}

// A frame over the bound must be refused from the header alone: the reader
// must not try to read (or allocate) the payload.
func TestReadOverLimitReadsOnlyHeader(t *testing.T) {
	r := bytes.NewReader(append(header(FrameStdout, Max+1), "rest"...))
	if _, _, err := Read(r); err == nil {
		t.Fatal("Read(Max+1) = nil error, want one")
	}
	if got := r.Len(); got != len("rest") {
		t.Errorf("Read(Max+1) consumed the payload: %d bytes left, want %d", got, len("rest"))
	}
}

type errWriter struct{ err error }

func (w errWriter) Write([]byte) (int, error) { return 0, w.err }

func TestWriteError(t *testing.T) {
	boom := errors.New("boom")
	for _, p := range [][]byte{nil, []byte("data")} {
		if err := Write(errWriter{boom}, FrameStdout, p); !errors.Is(err, boom) {
			t.Errorf("Write(failing writer, %q) = %v, want %v", p, err, boom)
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

func TestWriteSingleWrite(t *testing.T) {
	for _, p := range [][]byte{nil, []byte("hello")} {
		var w countWriter
		if err := Write(&w, FrameStdout, p); err != nil {
			t.Fatalf("Write(%q) = %v", p, err)
		}
		if w.writes != 1 {
			t.Errorf("Write(%q) made %d writes, want 1", p, w.writes)
		}
	}
}
