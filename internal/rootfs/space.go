package rootfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/units"
	"golang.org/x/sys/unix"
)

// Space is what the store holds and what it has promised.
//
// Every sandbox's files live in a sparse filesystem image as big as its
// disk bound, and copies (forks, snapshots, checkpoints, templates) share
// blocks until one side writes. So the store thin-provisions: without a
// check, one sandbox filling its disk fills the store, and a neighbour's
// write, acknowledged by its own filesystem, is lost when the loop device
// cannot get a block for it. The store therefore promises no more than it
// has: each sandbox's whole bound is reserved (it may rewrite every block,
// and each shared block it rewrites needs a new one), each saved copy and
// template counts the blocks it refers to (they never grow), and what is
// left after that, less a margin for the filesystem's own metadata, is what
// a new sandbox, fork, snapshot or checkpoint may ask for. A sandbox that
// fills its disk then gets ENOSPC from its own filesystem, and nothing else
// is touched.
type Space struct {
	Capacity int64 // size of the store's filesystem
	Promised int64 // sandboxes' bounds + blocks of saved copies and templates
	Meta     int64 // the filesystem's own use (log, metadata), and the margin
	Free     int64 // what may still be promised
}

// spaceMargin is kept free for the filesystem's metadata growth (extent and
// reference-count btrees grow as sandboxes write and copies diverge).
func spaceMargin(capacity int64) int64 { return 64<<20 + capacity/100 }

// Space measures the store; a figure is of one moment.
func (s *Storage) Space() (Space, error) {
	s.admitMu.Lock()
	defer s.admitMu.Unlock()
	return s.space()
}

// space is Space; caller holds admitMu.
func (s *Storage) space() (Space, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(s.dir, &st); err != nil {
		return Space{}, fmt.Errorf("measure the sandbox store: %w", err)
	}
	bs := int64(st.Bsize)
	sp := Space{Capacity: int64(st.Blocks) * bs}
	if s.image != "" {
		// A store image the host has not fully allocated holds no more
		// than what it has plus what the host has free.
		var ist unix.Stat_t
		var hst unix.Statfs_t
		if unix.Stat(s.image, &ist) == nil && ist.Blocks*512 < ist.Size && unix.Statfs(filepath.Dir(s.image), &hst) == nil {
			sp.Capacity = min(sp.Capacity, ist.Blocks*512+int64(hst.Bavail)*int64(hst.Bsize))
		}
	}
	var allocatedAll int64
	add := func(dir string, bound bool) {
		ents, _ := os.ReadDir(filepath.Join(s.dir, dir))
		for _, e := range ents {
			var fst unix.Stat_t
			if unix.Stat(filepath.Join(s.dir, dir, e.Name()), &fst) != nil {
				continue
			}
			alloc := fst.Blocks * 512
			allocatedAll += alloc
			if bound && !strings.HasSuffix(e.Name(), ".tmp") {
				sp.Promised += max(fst.Size, alloc)
			} else {
				sp.Promised += alloc
			}
		}
	}
	add("sandboxes", true)
	add("saved", false)
	add("templates", false)
	for _, n := range s.pending {
		sp.Promised += n
	}
	used := (int64(st.Blocks) - int64(st.Bfree)) * bs
	sp.Meta = max(0, used-allocatedAll) + spaceMargin(sp.Capacity)
	sp.Free = max(0, sp.Capacity-sp.Meta-sp.Promised)
	return sp, nil
}

// TemplateUsage is the count and bytes of the empty filesystems new
// sandboxes are copied from (one per disk size asked for).
// Backing is the store's image file on the host ("" when the store is a
// filesystem of its own): disk use counts it as the store, not as the server's.
func (s *Storage) Backing() string { return s.image }

func (s *Storage) TemplateUsage() (n int, bytes int64) {
	ents, _ := os.ReadDir(filepath.Join(s.dir, "templates"))
	for _, e := range ents {
		n++
		bytes += allocated(filepath.Join(s.dir, "templates", e.Name()))
	}
	return n, bytes
}

// Fits says whether need bytes could be promised now, for what; the
// promise itself is made by the call that makes the file.
func (s *Storage) Fits(need int64, what string) error {
	s.admitMu.Lock()
	defer s.admitMu.Unlock()
	return s.admit(need, what)
}

// admit checks that need more bytes can be promised, for what (e.g. "a
// sandbox with a 10GiB disk"), growing the store when they do not fit in
// it but fit on the host. Caller holds admitMu until the file that holds
// the promise exists, so two admissions never spend the same bytes.
func (s *Storage) admit(need int64, what string) error {
	sp, err := s.space()
	if err != nil {
		return err
	}
	if need <= sp.Free {
		return nil
	}
	room := int64(0)
	if s.growable() {
		// The metadata margin grows with the store: ask for it too.
		short := need - sp.Free + spaceMargin(need)
		ctx, cancel := context.WithTimeout(context.Background(), growTimeout)
		room, err = s.grow(ctx, short)
		cancel()
		if err != nil {
			return err
		}
		if room >= short {
			if sp, err = s.space(); err != nil {
				return err
			}
			if need <= sp.Free {
				return nil
			}
		}
	}
	return s.refusal(sp, need, room, what)
}

// growTimeout bounds one growth (an allocation and xfs_growfs).
const growTimeout = time.Minute

func (s *Storage) refusal(sp Space, need, room int64, what string) error {
	grows := ""
	switch {
	case s.growable() && s.max > 0 && fileSize(s.image) >= s.max:
		grows = "; it is at its most, " + units.FormatSize(s.max) + " (shard serve --storage-max)"
	case s.growable():
		grows = fmt.Sprintf("; it may grow by %s more (the host keeps shard serve --reserve free, and --storage-max bounds the store)", units.FormatSize(room))
	}
	return errdefs.New(errdefs.KindNoSpace, client.CodeInsufficientStorage,
		"not enough disk space for %s: it needs %s, and the sandbox store has %s free of %s%s (every sandbox's disk bound is reserved in full; remove sandboxes, snapshots or checkpoints, or give a smaller --disk)",
		what, units.FormatSize(need), units.FormatSize(sp.Free), units.FormatSize(sp.Capacity), grows)
}
