package host

import (
	"bytes"
	"net"
	"testing"

	"github.com/useshards/shard/internal/agent/proto"
	"github.com/useshards/shard/internal/framing"
)

// TestLowatReader: frames of every size class (empty, small ones that
// share a buffered read, ones just past lowatMin, ones past lowatMax) come
// through whole and in order over real TCP, into a reused buffer.
func TestLowatReader(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sizes := []int{0, 5, 100, 3, lowatMin, lowatMin + 1, 1, lowatMax + 17, 2, 1 << 20, 40, lowatMin - 1}
	frame := func(i int) []byte {
		b := make([]byte, sizes[i])
		for j := range b {
			b[j] = byte(i + j*31)
		}
		return b
	}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		for i := range sizes {
			if framing.Write(c, proto.FrameStdout, frame(i)) != nil {
				return
			}
		}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := newLowatReader(conn)
	if _, ok := r.(*lowatReader); !ok {
		t.Fatalf("newLowatReader of a TCP connection is a %T", r)
	}
	var buf []byte
	for i := range sizes {
		typ, p, err := framing.ReadInto(r, proto.MaxFrame, buf)
		if err != nil {
			t.Fatalf("frame %d (%d bytes): %v", i, sizes[i], err)
		}
		if typ != proto.FrameStdout || !bytes.Equal(p, frame(i)) {
			t.Fatalf("frame %d: type %q, %d bytes, want %d bytes as sent", i, typ, len(p), sizes[i])
		}
		if cap(p) > cap(buf) {
			buf = p[:0]
		}
	}
	if _, _, err := framing.ReadInto(r, proto.MaxFrame, buf); err == nil {
		t.Error("a frame after the last one")
	}
}
