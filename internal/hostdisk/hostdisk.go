// Package hostdisk keeps the server's promise to its host: whatever it
// writes to the data directory's filesystem (image layers, memory images of
// checkpoints and forks, growth of the sandbox store) leaves at least the
// reserve free for everything else on the machine, a second server or a
// test suite among them. The reserve is one number an operator sets
// (shard serve --reserve), not a share of the disk: 5% of a 252 GB disk
// kept 12.6 GiB from a neighbour that needed 9.
package hostdisk

import (
	"fmt"
	"sync"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/units"
	"golang.org/x/sys/unix"
)

// DefaultReserve is the reserve when none is set.
const DefaultReserve = 2 << 30

// Space is what statfs tells of a filesystem.
type Space struct {
	Avail, Total uint64 // bytes: available to unprivileged users, and all
	Ffree, Files uint64 // inodes: free, and all (0 if the filesystem does not say)
}

// Statfs measures dir's filesystem.
func Statfs(dir string) (Space, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return Space{}, err
	}
	bs := uint64(st.Bsize)
	return Space{Avail: st.Bavail * bs, Total: st.Blocks * bs, Ffree: st.Ffree, Files: st.Files}, nil
}

// Budget is the data directory's filesystem as the server may spend it.
// Writes whose size is known ahead (a memory image, the store's next step)
// take it first, so that concurrent ones do not all count the same free
// bytes; writes of unknown size (image layers) check as they go.
type Budget struct {
	dir     string
	reserve int64
	statfs  func(string) (Space, error)

	mu      sync.Mutex
	pending int64 // bytes taken and not yet written; guarded by mu
}

// New is the budget of dir's filesystem keeping reserve bytes free
// (DefaultReserve if 0; a negative reserve keeps nothing).
func New(dir string, reserve int64) *Budget {
	if reserve == 0 {
		reserve = DefaultReserve
	}
	return &Budget{dir: dir, reserve: max(reserve, 0), statfs: Statfs}
}

// WithStatfs makes b measure with f (tests make the disk look full or
// empty, whatever the host has free); it returns b.
func (b *Budget) WithStatfs(f func(string) (Space, error)) *Budget {
	b.statfs = f
	return b
}

// Roomy is a budget of dir's filesystem that sees a roomy disk (half of
// 1TiB free, a 1GiB reserve) whatever the host has: for tests, which never
// depend on what the machine has free.
func Roomy(dir string) *Budget {
	return New(dir, 1<<30).WithStatfs(func(string) (Space, error) {
		return Space{Total: 1 << 40, Avail: 1 << 39, Files: 1 << 20, Ffree: 1 << 19}, nil
	})
}

// Dir is the directory whose filesystem b spends.
func (b *Budget) Dir() string { return b.dir }

// Reserve is what b keeps free.
func (b *Budget) Reserve() int64 { return b.reserve }

// State is one look at the filesystem and what is promised on it.
type State struct {
	Total, Avail int64 // the filesystem's size, and what it has free
	Pending      int64 // taken by writes under way
	Reserve      int64
	Ffree, Files uint64
}

// Spendable is what may still be taken: free, less what writes under way
// were promised, less the reserve.
func (s State) Spendable() int64 { return max(0, s.Avail-s.Pending-s.Reserve) }

// State measures the filesystem.
func (b *Budget) State() (State, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state()
}

func (b *Budget) state() (State, error) {
	d, err := b.statfs(b.dir)
	if err != nil {
		return State{}, fmt.Errorf("measure the free space of %s: %w", b.dir, err)
	}
	return State{Total: clamp(d.Total), Avail: clamp(d.Avail), Pending: b.pending, Reserve: b.reserve, Ffree: d.Ffree, Files: d.Files}, nil
}

func clamp(n uint64) int64 { return int64(min(n, uint64(units.MaxSize))) }

// Take promises need bytes to a write of what, until release; it fails
// with 507 insufficient_storage when they would eat into the reserve.
func (b *Budget) Take(need int64, what string) (release func(), err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	st, err := b.state()
	if err != nil {
		return nil, err
	}
	if need > st.Spendable() {
		return nil, b.refusal(st, what, need)
	}
	b.pending += need
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			b.pending -= need
			b.mu.Unlock()
		})
	}, nil
}

// Check fails when the filesystem is down to its reserve (or to 5% of its
// inodes): for writes whose size is not known ahead, made in steps.
func (b *Budget) Check(what string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	st, err := b.state()
	if err != nil {
		return err
	}
	if st.Avail-st.Pending < st.Reserve {
		return b.refusal(st, what, 0)
	}
	if st.Files > 0 && st.Ffree < st.Files/20 {
		return errdefs.New(errdefs.KindNoSpace, client.CodeInsufficientStorage,
			"not enough free inodes for %s: the server keeps 5%% of its disk's inodes (%d) free, and has %d left; free some (remove images, sandboxes, snapshots or checkpoints) and try again",
			what, st.Files/20, st.Ffree)
	}
	return nil
}

func (b *Budget) refusal(st State, what string, need int64) error {
	needs := ""
	if need > 0 {
		needs = " (it needs " + units.FormatSize(need) + ")"
	}
	return errdefs.New(errdefs.KindNoSpace, client.CodeInsufficientStorage,
		"not enough disk space for %s%s: the server's disk has %s free, and the server keeps %s of it free for the rest of the host (shard serve --reserve); free space (remove images, sandboxes, snapshots or checkpoints) and try again",
		what, needs, units.FormatSize(max(0, st.Avail-st.Pending)), units.FormatSize(st.Reserve))
}
