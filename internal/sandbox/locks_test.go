package sandbox

import (
	"sync"
	"testing"
	"time"
)

// A drop of a checkpoint waits for its uses; a use that begins after the
// drop waits for the drop (and then finds the record gone); the table of
// uses empties.
func TestCheckpointUseHoldsDrop(t *testing.T) {
	var c ckRefs
	use := c.use("ck1")
	other := c.use("ck2") // another checkpoint is not held up
	dropped, dropDone := make(chan struct{}), make(chan struct{})
	go func() {
		done := c.drop("ck1")
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
	go func() { c.use("ck1")(); close(late) }()
	select {
	case <-late:
	case <-time.After(5 * time.Second):
		t.Fatal("a use after the drop never got its turn")
	}
	<-dropDone
	if n := c.size(); n != 0 {
		t.Fatalf("%d checkpoint uses left in the table", n)
	}
}

// A keyed mutex serialises holders of one key, not of two, and forgets a
// key nobody holds.
func TestKeyedMutex(t *testing.T) {
	var k keyedMutex
	unlockA := k.lock("a")
	k.lock("b")() // another key is not held up
	var mu sync.Mutex
	order := []string{}
	done := make(chan struct{})
	go func() {
		u := k.lock("a")
		mu.Lock()
		order = append(order, "second")
		mu.Unlock()
		u()
		close(done)
	}()
	time.Sleep(30 * time.Millisecond)
	mu.Lock()
	order = append(order, "first")
	mu.Unlock()
	unlockA()
	unlockA() // idempotent
	<-done
	if len(order) != 2 || order[0] != "first" {
		t.Fatalf("order %v: the second holder of a key did not wait", order)
	}
	if n := k.size(); n != 0 {
		t.Fatalf("%d keys left in the table", n)
	}
}
