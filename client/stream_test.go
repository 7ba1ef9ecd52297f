package client

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func frame(typ byte, p string) string {
	var h [5]byte
	h[0] = typ
	binary.BigEndian.PutUint32(h[1:], uint32(len(p)))
	return string(h[:]) + p
}

func TestReadFramedExec(t *testing.T) {
	tests := []struct {
		name             string
		stream           string
		stdout, stderr   string
		code             int
		errCode, errPart string
	}{
		{"output and exit", frame('S', `{"pid":3}`) + frame('O', "out") + frame('E', "err") + frame('O', "\x00\xff") + frame('X', `{"exit_code":3}`),
			"out\x00\xff", "err", 3, "", ""},
		{"unknown frames ignored", frame('S', `{"pid":3}`) + frame('Z', "?") + frame('O', "a") + frame('X', `{"exit_code":0,"timed_out":true}`),
			"a", "", 0, "", ""},
		{"lost the sandbox", frame('S', `{}`) + frame('O', "a") + frame('F', `{"code":"sandbox_unreachable","message":"lost it"}`),
			"a", "", 0, "sandbox_unreachable", "lost it"},
		{"ends before the exit", frame('S', `{}`) + frame('O', "a"), "a", "", 0, "stream_ended", "ended before"},
		{"cut inside a frame", frame('S', `{}`) + frame('O', "abc")[:6], "", "", 0, "", "unexpected EOF"},
		{"a frame past the bound", frame('S', `{}`) + "O\xff\xff\xff\xff", "", "", 0, "", "exceeds the limit"},
		{"bad exit", frame('X', `{`), "", "", 0, "", "exit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// One byte a read: every frame header and payload split.
			var out, errb bytes.Buffer
			res, err := readFramedExec(iotest.OneByteReader(strings.NewReader(tt.stream)), &out, &errb)
			if out.String() != tt.stdout || errb.String() != tt.stderr {
				t.Errorf("stdout %q stderr %q, want %q %q", out.String(), errb.String(), tt.stdout, tt.stderr)
			}
			if tt.errPart == "" {
				if err != nil || res.ExitCode != tt.code {
					t.Fatalf("= %+v, %v; want exit %d", res, err, tt.code)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.errPart) {
				t.Fatalf("err = %v, want it to say %q", err, tt.errPart)
			}
			var e *Error
			if tt.errCode != "" && (!errors.As(err, &e) || e.Code != tt.errCode) {
				t.Errorf("err = %#v, want code %s", err, tt.errCode)
			}
		})
	}
}

// TestSendFramedBody (through Read, the fallback): the request frame, stdin in frames of at most
// stdinChunk, and the empty frame that closes stdin.
func TestSendFramedBody(t *testing.T) {
	stdin := strings.Repeat("x", stdinChunk+10)
	fr := &frameReader{r: newFramedBody([]byte(`{"argv":["cat"]}`), strings.NewReader(stdin))}
	var types []byte
	var got strings.Builder
	lastLen := -1
	for {
		typ, p, err := fr.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, typ)
		switch typ {
		case FrameRequest:
			if string(p) != `{"argv":["cat"]}` {
				t.Errorf("request frame %q", p)
			}
		case FrameStdin:
			if len(p) > stdinChunk {
				t.Errorf("a stdin frame of %d bytes, want at most %d", len(p), stdinChunk)
			}
			got.Write(p)
			lastLen = len(p)
		}
	}
	if types[0] != FrameRequest || types[len(types)-1] != FrameStdin || lastLen != 0 || got.String() != stdin {
		t.Errorf("frames %q, stdin %d bytes; want Q first, stdin whole, an empty I last", types, got.Len())
	}
}

// frameWrites checks that every Write is exactly one whole frame.
type frameWrites struct {
	t     *testing.T
	stdin strings.Builder
	types []byte
}

func (w *frameWrites) Write(p []byte) (int, error) {
	if len(p) < 5 || int(binary.BigEndian.Uint32(p[1:5])) != len(p)-5 {
		w.t.Fatalf("a write of %d bytes is not one frame", len(p))
	}
	w.types = append(w.types, p[0])
	if p[0] == FrameStdin {
		w.stdin.Write(p[5:])
	}
	return len(p), nil
}

// TestFramedBodyWriteTo: what net/http's transport uses sends each frame in
// one write (one chunk for the server to read), stdin whole and closed.
func TestFramedBodyWriteTo(t *testing.T) {
	stdin := strings.Repeat("y", 3*stdinChunk+7)
	w := &frameWrites{t: t}
	if _, err := newFramedBody([]byte(`{}`), strings.NewReader(stdin)).WriteTo(w); err != nil {
		t.Fatal(err)
	}
	if w.types[0] != FrameRequest || w.types[len(w.types)-1] != FrameStdin || w.stdin.String() != stdin {
		t.Errorf("frames %q, stdin %d bytes; want Q first, stdin whole", w.types, w.stdin.Len())
	}
}

// TestFramedBodySignals: a signal goes as a signal frame, also after
// stdin's end, and the body stays open for more until it is closed.
func TestFramedBodySignals(t *testing.T) {
	sigs := make(chan int)
	b := newFramedBody([]byte(`{}`), strings.NewReader(""))
	b.signals = sigs
	fr := &frameReader{r: b}
	for _, want := range []struct {
		typ byte
		p   string
	}{{FrameRequest, `{}`}, {FrameStdin, ""}} {
		typ, p, err := fr.next()
		if err != nil || typ != want.typ || string(p) != want.p {
			t.Fatalf("frame %q %q, %v; want %q %q", typ, p, err, want.typ, want.p)
		}
	}
	for _, sig := range []int{2, 15} {
		sigs <- sig
		typ, p, err := fr.next()
		if want := fmt.Sprintf(`{"signal":%d}`, sig); err != nil || typ != FrameSignal || string(p) != want {
			t.Fatalf("frame %q %q, %v; want %q %s", typ, p, err, FrameSignal, want)
		}
	}
	b.Close()
	if typ, _, err := fr.next(); err == nil {
		t.Fatalf("a frame %q after Close", typ)
	}
}
