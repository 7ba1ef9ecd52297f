package guest

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/agent/proto"
)

// A pipe that cannot be made half-way through a command's stdio leaves none
// of those made before it open (nor the /dev/null of its stdin).
func TestStartClosesStdioOnFailure(t *testing.T) {
	tests := []struct {
		name   string
		stdin  bool
		failAt int // the pipe that fails, counted from 1
	}{
		{"stdout's pipe, stdin /dev/null", false, 1},
		{"stderr's pipe, stdin /dev/null", false, 2},
		{"stdout's pipe after stdin's", true, 2},
		{"stderr's pipe after stdin's", true, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var made []*os.File
			calls := 0
			newPipe = func() (*os.File, *os.File, error) {
				calls++
				if calls == tt.failAt {
					return nil, nil, errors.New("no more pipes")
				}
				r, w, err := bigPipe()
				made = append(made, r, w)
				return r, w, err
			}
			t.Cleanup(func() { newPipe = bigPipe })
			nulls := devNulls(t)
			s := &Server{baseEnv: os.Environ(), reaper: newReaper()}
			p, err := s.start(&proto.Request{Argv: []string{"true"}, Stdin: tt.stdin})
			if err == nil || err.Code != client.CodeInternal {
				t.Fatalf("start with pipe %d failing = %v, %v; want an %s error", tt.failAt, p, err, client.CodeInternal)
			}
			if calls != tt.failAt {
				t.Fatalf("start made %d pipes, want %d (the last failing)", calls, tt.failAt)
			}
			for _, f := range made {
				if cerr := f.Close(); !errors.Is(cerr, os.ErrClosed) {
					t.Errorf("pipe end %s left open by the failed start (Close = %v)", f.Name(), cerr)
				}
			}
			if got := devNulls(t); got != nulls {
				t.Errorf("descriptors of %s: %d before the failed start, %d after", os.DevNull, nulls, got)
			}
		})
	}
}

// devNulls counts this process's descriptors open on /dev/null.
func devNulls(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("read /proc/self/fd: %v", err)
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && target == os.DevNull {
			n++
		}
	}
	return n
}
