package sandbox

import (
	"fmt"
	"sync"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/hostdisk"
	"github.com/useshards/shard/internal/units"
)

// The ledger's floor (shard serve --ledger-min-free). The ledger lives in
// the database under the data directory, and a full disk there breaks the
// database for every project. So a request that would add to the ledger
// (an exec, a create, fork, restore or resume, a checkpoint, a snapshot, a
// start, a grant, a policy) is refused with 507 before anything is written
// while that filesystem has less free than the floor. What the server
// records of what happened (stops, removals, failures, the end of an exec
// already running) and what takes access away (an ungrant) are always
// written: the ledger must not miss what it is for.

// ledgerFreshness is how long one look at the free space serves: an exec
// costs a lock and a clock read, not a statfs.
const ledgerFreshness = time.Second

// ledgerFloor refuses ledger growth below a free-space floor.
type ledgerFloor struct {
	dir     string
	minFree int64                                             // the floor; 0: hostdisk.DefaultReserve; < 0: none
	free    func(dir string) (avail, total uint64, err error) // statfs; tests fake it
	now     func() time.Time

	mu           sync.Mutex
	at           time.Time // when avail and total were measured (zero: never); guarded by mu
	avail, total uint64    // guarded by mu
}

func newLedgerFloor(dir string, minFree int64) *ledgerFloor {
	return &ledgerFloor{dir: dir, minFree: minFree, free: freeSpace, now: time.Now}
}

func freeSpace(dir string) (avail, total uint64, err error) {
	d, err := hostdisk.Statfs(dir)
	return d.Avail, d.Total, err
}

// check fails when the data directory's filesystem is below the floor.
// what says what the request would record, for the message ("run a
// command in sandbox web").
func (f *ledgerFloor) check(what string) error {
	if f == nil || f.minFree < 0 {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	if f.at.IsZero() || now.Sub(f.at) >= ledgerFreshness || now.Before(f.at) {
		avail, total, err := f.free(f.dir)
		if err != nil {
			return fmt.Errorf("measure the free space of %s: %w", f.dir, err)
		}
		f.avail, f.total, f.at = avail, total, now
	}
	floor, from := uint64(f.minFree), "set by shard serve --ledger-min-free"
	if f.minFree == 0 {
		floor, from = hostdisk.DefaultReserve, "the server's reserve; shard serve --ledger-min-free sets it"
	}
	if f.avail >= floor {
		return nil
	}
	return errdefs.New(errdefs.KindNoSpace, client.CodeInsufficientStorage,
		"cannot %s: the server's data directory has %s free, below the %s it keeps free for its database (%s); nothing was done. Free space (remove sandboxes, snapshots, checkpoints, images or ledger sessions: shard ledger rm) and try again",
		what, units.FormatSize(sizeInt(f.avail)), units.FormatSize(sizeInt(floor)), from)
}

// sizeInt is n for FormatSize, which takes an int64.
func sizeInt(n uint64) int64 {
	return int64(min(n, uint64(units.MaxSize)))
}
