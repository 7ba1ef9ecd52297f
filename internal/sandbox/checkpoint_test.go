package sandbox

import (
	"testing"
	"time"
)

// A drop of a checkpoint waits for its uses; a use that begins after the
// drop waits for the drop (and then finds the record gone); the table of
// uses empties.
func TestCheckpointUseHoldsDrop(t *testing.T) {
	s := &Service{ckUses: map[string]*ckUse{}}
	use := s.useCheckpoint("ck1")
	other := s.useCheckpoint("ck2") // another checkpoint is not held up
	dropped, dropDone := make(chan struct{}), make(chan struct{})
	go func() {
		done := s.holdCheckpoint("ck1", true)
		close(dropped)
		time.Sleep(20 * time.Millisecond)
		done()
		close(dropDone)
	}()
	select {
	case <-dropped:
		t.Fatal("the drop did not wait for the use")
	case <-time.After(50 * time.Millisecond):
	}
	other()
	use()
	use() // release is idempotent
	<-dropped
	late := make(chan struct{})
	go func() { s.useCheckpoint("ck1")(); close(late) }()
	select {
	case <-late:
	case <-time.After(5 * time.Second):
		t.Fatal("a use after the drop never got its turn")
	}
	<-dropDone
	s.locksMu.Lock()
	n := len(s.ckUses)
	s.locksMu.Unlock()
	if n != 0 {
		t.Fatalf("%d checkpoint uses left in the table", n)
	}
}
