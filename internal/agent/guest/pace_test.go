package guest

import (
	"bytes"
	"fmt"
	"io"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestPaceAfterRead(t *testing.T) {
	const size = 1 << 20
	tests := []struct {
		name string
		from time.Duration
		n    int
		want time.Duration
	}{
		{"nothing came: read at once", 10 * time.Millisecond, 0, 0},
		{"a trickle: soon", 30 * time.Millisecond, 100, paceMin},
		{"flowing from quiet", 0, 64 << 10, paceMin},
		{"a quarter pipe: wait twice as long", 8 * time.Millisecond, size / 4, 16 * time.Millisecond},
		{"a crumb per wait: at most 4x longer", 2 * time.Millisecond, 8 << 10, 8 * time.Millisecond},
		{"bounded above", 32 * time.Millisecond, size / 8, paceMax},
		{"the pipe filled: halve", 16 * time.Millisecond, size, 8 * time.Millisecond},
		{"filled at the floor", paceMin, size, paceMin},
		{"three quarters: a bit shorter", 12 * time.Millisecond, size * 3 / 4, 8 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pace{d: tt.from}
			if got := p.afterRead(tt.n, size); got != tt.want {
				t.Errorf("afterRead(%d) from %v = %v, want %v", tt.n, tt.from, got, tt.want)
			}
		})
	}
}

func TestPaceDrained(t *testing.T) {
	const size = 1 << 20
	tests := []struct {
		name string
		from time.Duration
		left int
		want time.Duration
	}{
		{"ran dry: halve", 8 * time.Millisecond, 0, 4 * time.Millisecond},
		{"ran dry at the floor", paceMin, 0, paceMin},
		{"hardly moved: double", 8 * time.Millisecond, size * 3 / 4, 16 * time.Millisecond},
		{"bounded above", paceMax, size, paceMax},
		{"about half: keep", 8 * time.Millisecond, size / 3, 8 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pace{d: tt.from}
			p.drained(tt.left, size)
			if p.d != tt.want {
				t.Errorf("drained(%d) from %v = %v, want %v", tt.left, tt.from, p.d, tt.want)
			}
		})
	}
}

// TestWritePaced: everything reaches a reader slower than the writer, in
// order, through a full non-blocking pipe; a closed reader is an error.
func TestWritePaced(t *testing.T) {
	r, w, err := bigPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	size := pipeSizeOf(r)
	if size == 0 {
		t.Fatal("pipeSizeOf: 0 for a pipe")
	}
	if err := unix.SetNonblock(int(w.Fd()), true); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 3*size+12345)
	for i := range want {
		want[i] = byte(i * 7)
	}
	got := make(chan []byte)
	go func() {
		var b bytes.Buffer
		buf := make([]byte, 4096)
		for {
			n, err := r.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				got <- b.Bytes()
				return
			}
			if b.Len()%(256<<10) < 4096 {
				time.Sleep(time.Millisecond) // a slow reader
			}
		}
	}()
	var p pace
	if n, err := writePaced(int(w.Fd()), want, size, &p); err != nil || n != len(want) {
		t.Fatalf("writePaced = %d, %v; want %d, nil", n, err, len(want))
	}
	w.Close()
	if g := <-got; !bytes.Equal(g, want) {
		t.Fatalf("the reader got %d bytes, not the %d written", len(g), len(want))
	}
	if p.d < paceMin || p.d > paceMax {
		t.Errorf("pace %v out of [%v, %v]", p.d, paceMin, paceMax)
	}

	// A reader that is gone: the write fails (EPIPE), it does not spin.
	r2, w2, err := bigPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	unix.SetNonblock(int(w2.Fd()), true)
	r2.Close()
	if n, err := writePaced(int(w2.Fd()), want, size, &p); err == nil || n != 0 {
		t.Errorf("writePaced to a closed pipe = %d, %v; want 0 and an error", n, err)
	}
}

// TestWritePacedStuckReader: a reader that holds the pipe and never reads
// gets the rest written blocking (no wake-up every paceMax for as long as
// it lives), and once it reads, all of it comes and the pipe end is
// non-blocking again.
func TestWritePacedStuckReader(t *testing.T) {
	r, w, err := bigPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	fd := int(w.Fd())
	if err := unix.SetNonblock(fd, true); err != nil {
		t.Fatal(err)
	}
	size := pipeSizeOf(r)
	want := bytes.Repeat([]byte("z"), 2*size+99)
	done := make(chan error, 1)
	go func() {
		var p pace
		n, err := writePaced(fd, want, size, &p)
		if err == nil && n != len(want) {
			err = fmt.Errorf("writePaced wrote %d of %d", n, len(want))
		}
		done <- err
	}()
	blocking := func() bool {
		fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
		return err == nil && fl&unix.O_NONBLOCK == 0
	}
	deadline := time.Now().Add(5 * time.Second)
	for !blocking() {
		if time.Now().After(deadline) {
			t.Fatal("a writer to a reader that never reads is still pacing (polling) after 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	got, err := io.ReadAll(io.LimitReader(r, int64(len(want))))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes (%v), want the %d written", len(got), err, len(want))
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if blocking() {
		t.Error("the pipe end was left blocking")
	}
}

// outputHup says the writers are gone only once the last write end closed,
// with unread output still in the pipe; outputPending sees that output.
func TestOutputHup(t *testing.T) {
	r, w, err := bigPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p := &proc{outputs: []io.Reader{r}}
	if p.outputHup() || p.outputPending() {
		t.Fatal("an open, empty pipe: hup or pending")
	}
	w.Write([]byte("left"))
	if p.outputHup() || !p.outputPending() {
		t.Fatal("an open pipe with output: want pending, not hup")
	}
	w.Close()
	if !p.outputHup() || !p.outputPending() {
		t.Fatal("the writer gone, output unread: want hup and pending")
	}
}
