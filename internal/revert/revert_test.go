package revert

import (
	"slices"
	"sync"
	"testing"
)

func TestReverter(t *testing.T) {
	tests := []struct {
		name string
		run  func(r *Reverter, add func(int))
		want []int // undo steps run, in order
	}{
		{"fail runs newest first", func(r *Reverter, add func(int)) { add(1); add(2); add(3); r.Fail() }, []int{3, 2, 1}},
		{"success runs nothing", func(r *Reverter, add func(int)) { add(1); add(2); r.Success(); r.Fail() }, nil},
		{"fail twice runs once", func(r *Reverter, add func(int)) { add(1); r.Fail(); r.Fail() }, []int{1}},
		{"add after fail is dropped", func(r *Reverter, add func(int)) { add(1); r.Fail(); add(2); r.Fail() }, []int{1}},
		{"add after success is dropped", func(r *Reverter, add func(int)) { r.Success(); add(1); r.Fail() }, nil},
		{"nothing registered", func(r *Reverter, add func(int)) { r.Fail() }, nil},
		{"clone takes the steps over", func(r *Reverter, add func(int)) {
			add(1)
			c := r.Clone()
			add(2) // r ended with the clone: dropped
			r.Fail()
			c.Fail()
		}, []int{1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []int
			r := New()
			tt.run(r, func(i int) { r.Add(func() { got = append(got, i) }) })
			if !slices.Equal(got, tt.want) {
				t.Errorf("undo ran %v, want %v", got, tt.want)
			}
		})
	}
}

// Steps run in parallel register their undos concurrently; Fail runs each
// once.
func TestReverterConcurrentAdd(t *testing.T) {
	r := New()
	var mu sync.Mutex
	ran := map[int]int{}
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.Add(func() { mu.Lock(); ran[i]++; mu.Unlock() })
		}()
	}
	wg.Wait()
	r.Fail()
	if len(ran) != 50 {
		t.Fatalf("%d undo steps ran, want 50", len(ran))
	}
	for i, n := range ran {
		if n != 1 {
			t.Errorf("undo %d ran %d times, want 1", i, n)
		}
	}
}
