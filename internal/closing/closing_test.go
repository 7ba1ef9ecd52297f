package closing

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A closing group refuses new work, closes Done, and waits for what it
// holds: until the holder lets go, or ctx ends.
func TestGroup(t *testing.T) {
	var g Group
	release, ok := g.Hold()
	if !ok || g.Closing() {
		t.Fatal("a new group refused a hold")
	}
	ran := make(chan struct{})
	if !g.Go(func() { close(ran) }) {
		t.Fatal("a new group refused a goroutine")
	}
	<-ran
	if !g.Begin() || g.Begin() {
		t.Fatal("Begin began twice, or not at all")
	}
	select {
	case <-g.Done():
	default:
		t.Fatal("Done is not closed after Begin")
	}
	if _, ok := g.Hold(); ok || g.Go(func() {}) {
		t.Fatal("a closing group took more work")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := g.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with a hold still held = %v, want the deadline", err)
	}
	release()
	release() // a second call does nothing
	if err := g.Wait(context.Background()); err != nil {
		t.Fatalf("Wait after the release = %v", err)
	}
}
