package client

import (
	"bytes"
	"encoding/binary"
	"errors"
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

// TestSendFramedBody: the request frame, stdin in frames of at most
// stdinChunk, and the empty frame that closes stdin.
func TestSendFramedBody(t *testing.T) {
	pr, pw := io.Pipe()
	stdin := strings.Repeat("x", stdinChunk+10)
	go sendFramedBody(pw, []byte(`{"argv":["cat"]}`), strings.NewReader(stdin))
	fr := &frameReader{r: pr}
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
