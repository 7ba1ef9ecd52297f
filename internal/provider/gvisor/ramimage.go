package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/useshards/shard/internal/provider"
	"golang.org/x/sys/unix"
)

// Memory images in RAM first.
//
// The Sentry writes a checkpoint's pages while the source is frozen, and
// whatever it writes into is charged to the sandbox's memory cgroup: page
// cache of a file on disk (a big sandbox then crawls through reclaim and
// writeback: 1 GiB resident took 2-4.5 s), or tmpfs pages, which cannot be
// reclaimed at all and could push the sandbox over its bound. Writing with
// O_DIRECT avoids the charge but makes the freeze wait for the disk.
//
// So the pages go to a file on tmpfs (ImageRAM) whose pages shard allocated
// itself before the pause (fallocate: charged to shard, not the sandbox; the
// Sentry's writes land in pages that already exist). The freeze is then a
// memory copy. After the thaw the file is copied to the checkpoint's
// directory on disk in the background and the RAM copy freed; until then
// dir/pages.img is a symbolic link to it, so a restore (a fork's, at once)
// reads the pages from RAM.

// ramImageMax is the largest sandbox (its memoryUsage) whose image is
// staged in RAM. Above it the pages go straight to disk: measured here at
// 1 GiB resident, the freeze was 0.53 s from RAM against 0.60-0.64 s direct,
// but the fork was usable after 3.1 s against 1.8 s (the restore itself
// slower, for a reason not found yet), and the RAM copy is that big.
const ramImageMax = 512 << 20

// ramImages tracks copies to disk in flight, by checkpoint dir.
type ramImages struct {
	mu       sync.Mutex
	inFlight map[string]*copyToDisk
}

type copyToDisk struct {
	done chan struct{}
	err  error // set before done closes
}

const pagesFile = "pages.img"

func (p *Provider) ramFile(dir string) string {
	return filepath.Join(p.opts.ImageRAM, filepath.Base(dir)+".pages")
}

// StageImage gets dir ready for a checkpoint of sandbox id before it is
// paused: a file in RAM for its pages, with room for what the sandbox holds
// now allocated by shard. Without ImageRAM, or for a sandbox over
// ramImageMax, it does nothing (pages are written to disk with O_DIRECT).
func (p *Provider) StageImage(ctx context.Context, id, dir string) error {
	if p.opts.ImageRAM == "" {
		p.notes.Store(dir, "no RAM directory for images (--image-ram-dir none)")
		return nil
	}
	ok, why := p.memoryHandoff(ctx)
	var mem *os.File
	var n, budget int64
	if !ok {
		n, budget = p.memoryUsage(id), ramImageMax
	} else {
		// The memory file itself says what it holds (the cgroup does
		// not count a memory file adopted at a restore).
		var err error
		if mem, err = p.sentryMemory(ctx, id); err != nil {
			p.notes.Store(dir, err.Error())
			return err
		}
		defer mem.Close()
		n, budget = allocated(mem), p.handoffMax()
	}
	if n <= 0 || n > budget {
		if n <= 0 {
			p.notes.Store(dir, "its memory use could not be read")
		} else {
			p.notes.Store(dir, fmt.Sprintf("it held %d MiB, over the %d MiB staged in RAM", n>>20, budget>>20))
		}
		return nil
	}
	// Images of other checkpoints not on disk yet hold RAM too: all of them
	// together stay within the budget.
	if used, all := p.ramInUse(), p.ramBudget(); used+n > all {
		p.notes.Store(dir, fmt.Sprintf("RAM for images was taken: %d MiB of %d MiB by other checkpoints and forks", used>>20, all>>20))
		return nil
	}
	if err := os.MkdirAll(p.opts.ImageRAM, 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if ok {
		err := p.stageMemoryCopy(id, dir, mem)
		if err != nil {
			p.notes.Store(dir, err.Error())
		}
		return err
	}
	p.notes.Store(dir, why)
	ram := p.ramFile(dir)
	f, err := createLinked(filepath.Join(dir, pagesFile), ram)
	if err != nil {
		return err
	}
	defer f.Close()
	// KEEP_SIZE: the file stays empty, the pages are there.
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, 0, n); err != nil {
		os.Remove(ram)
		os.Remove(filepath.Join(dir, pagesFile))
		return fmt.Errorf("room in RAM for the image of %s: %w", id, err)
	}
	return nil
}

// createLinked creates the RAM file ram, linked from link. The link comes
// first: a server killed in between leaves a link to nothing, or a link to
// the file, and the checkpoint's removal (RemoveImage) takes both; never a
// file in RAM that nothing names.
func createLinked(link, ram string) (*os.File, error) {
	if err := os.Symlink(ram, link); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(ram, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		os.Remove(link)
		return nil, err
	}
	return f, nil
}

// memoryUsage is an upper bound of the pages an image of sandbox id can
// hold, or 0 if it cannot be read: the shared memory its memory cgroup
// holds (the Sentry's memory file is a memfd, so every page an image can
// have is counted there), else all the cgroup holds.
func (p *Provider) memoryUsage(id string) int64 {
	for _, dir := range []string{
		filepath.Join("/sys/fs/cgroup/memory/shard", id), // cgroup v1
		filepath.Join("/sys/fs/cgroup/shard", id),        // cgroup v2
	} {
		if n, ok := shmemOf(filepath.Join(dir, "memory.stat")); ok {
			return n
		}
		for _, f := range []string{"memory.usage_in_bytes", "memory.current"} {
			if b, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
				n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				return n
			}
		}
	}
	return 0
}

// shmemOf reads the shared memory a cgroup's memory.stat counts
// (total_shmem in v1, which includes child cgroups; shmem in v2).
func shmemOf(statFile string) (int64, bool) {
	b, err := os.ReadFile(statFile)
	if err != nil {
		return 0, false
	}
	var shmem int64
	found := false
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		switch k {
		case "total_shmem":
			n, err := strconv.ParseInt(v, 10, 64)
			return n, err == nil
		case "shmem":
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				shmem, found = n, true
			}
		}
	}
	return shmem, found
}

// openPages opens dir's pages file for the Sentry to write: the staged RAM
// file if there is one, else a new file on disk with O_DIRECT.
func openPages(dir string) (f *os.File, ram bool, err error) {
	path := filepath.Join(dir, pagesFile)
	if st, err := os.Lstat(path); err == nil && st.Mode()&os.ModeSymlink != 0 {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		return f, true, err
	}
	// --direct, as runsc would, for the reason in the comment above.
	f, err = os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR|unix.O_DIRECT, 0o644)
	return f, false, err
}

// saved is called once the Sentry has written the pages into a RAM file:
// it frees the room it did not use. The copy to disk waits for Persisted:
// a fork's restores read the RAM copy first, undisturbed by a disk busy
// with the copy.
func (p *Provider) saved(f *os.File) {
	if st, err := f.Stat(); err == nil {
		// Pages allocated past the end are not the file's: give them back.
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Blocks*512 > st.Size() {
			unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, st.Size(), sys.Blocks*512)
		}
	}
}

// Persisted returns once the image in dir is all on disk: it copies the
// pages still in RAM (one copy at a time per dir; a second caller waits
// for the first), also those a restart of shard left in RAM.
func (p *Provider) Persisted(ctx context.Context, dir string) error {
	p.ram.mu.Lock()
	if p.ram.inFlight == nil {
		p.ram.inFlight = map[string]*copyToDisk{}
	}
	c, ok := p.ram.inFlight[dir]
	if !ok {
		c = &copyToDisk{done: make(chan struct{})}
		p.ram.inFlight[dir] = c
		go func() {
			c.err = persist(dir)
			p.ram.mu.Lock()
			delete(p.ram.inFlight, dir)
			p.ram.mu.Unlock()
			close(c.done)
		}()
	}
	p.ram.mu.Unlock()
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close waits, until ctx ends, for the copies to disk still running (one
// cut short leaves its pages in RAM, and the next start finishes it).
func (p *Provider) Close(ctx context.Context) error {
	p.ram.mu.Lock()
	var all []*copyToDisk
	for _, c := range p.ram.inFlight {
		all = append(all, c)
	}
	p.ram.mu.Unlock()
	for _, c := range all {
		select {
		case <-c.done:
		case <-ctx.Done():
			return fmt.Errorf("checkpoint images still being copied to disk: %w", ctx.Err())
		}
	}
	return nil
}

// persist copies dir's pages and memory file from RAM to disk (those still
// in RAM), puts each copy in its link's place and frees the RAM. A RAM file
// that is gone (the host restarted before the copy) is an error: the image
// is lost.
func persist(dir string) error {
	return errors.Join(persistFile(dir, pagesFile), persistFile(dir, memoryFile))
}

func persistFile(dir, name string) error {
	link := filepath.Join(dir, name)
	ram, err := os.Readlink(link)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) && (errors.Is(pe.Err, unix.EINVAL) || errors.Is(pe.Err, os.ErrNotExist)) {
			return nil // a plain file (on disk already), or no image any more
		}
		return err
	}
	src, err := os.Open(ram)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("checkpoint %s: %w (%v)", filepath.Base(dir), provider.ErrImageLost, err)
	}
	if err != nil {
		return err
	}
	defer src.Close()
	tmp := link + ".tmp"
	err = copyDirect(tmp, src)
	if err == nil {
		err = os.Rename(tmp, link)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		os.Remove(tmp)
		if _, serr := os.Stat(dir); errors.Is(serr, os.ErrNotExist) {
			os.Remove(ram)
			return nil // the checkpoint was removed meanwhile: nothing to keep
		}
		return err
	}
	return os.Remove(ram)
}

// copyDirect writes src to a new file at path with O_DIRECT, then syncs it.
// Not through the page cache: a gigabyte of dirty pages there, flushed by
// one fsync, made every other sync on the disk (a new sandbox's, a restore's)
// wait behind it for seconds. src's holes stay holes (a memory file is
// mostly hole).
func copyDirect(path string, src *os.File) error {
	dst, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|unix.O_DIRECT, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if dst != nil {
			dst.Close()
		}
	}()
	buf, err := unix.Mmap(-1, 0, 4<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	defer unix.Munmap(buf) // page aligned, as O_DIRECT wants
	st, err := src.Stat()
	if err != nil {
		return err
	}
	err = forEachExtent(src, func(off, n int64) error {
		end := min(off+n, st.Size())
		for off < end {
			w := buf[:min(int64(len(buf)), end-off)]
			if _, err := src.ReadAt(w, off); err != nil {
				return err
			}
			if len(w)%4096 != 0 {
				// A tail that is not whole blocks: write it through the
				// page cache.
				if err := dst.Close(); err != nil {
					return err
				}
				if dst, err = os.OpenFile(path, os.O_WRONLY, 0); err != nil {
					return err
				}
			}
			if _, err := dst.WriteAt(w, off); err != nil {
				return err
			}
			off += int64(len(w))
		}
		return nil
	})
	if err == nil {
		err = dst.Truncate(st.Size())
	}
	if err == nil {
		err = dst.Sync()
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	dst = nil
	return err
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
