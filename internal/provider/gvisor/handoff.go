package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/useshards/shard/internal/hostdir"
	"github.com/useshards/shard/internal/oci"
	"github.com/useshards/shard/internal/provider"
	"golang.org/x/sys/unix"
)

// Memory handoff: a fork gets a copy of its source's memory file instead of
// a page-by-page load.
//
// gVisor keeps a sandbox's memory in one file (the Sentry's memfd
// "runsc-memory"), and its checkpoint metadata names each committed range
// by its offset in that file. A save with a copy of that file (the runsc
// patch in tools/runsc/patches: the Sentry writes the committed ranges at
// their own offsets into a file shard gave it, in place of the pages file)
// leaves a checkpoint whose memory.img is exactly the file a restore would
// have filled. A restore then adopts a copy of it as its memory file
// (runsc restore --memory-file) and loads no page.
//
// The checkpoint's memory.img is a file in RAM (ImageRAM) whose pages shard
// allocated before the pause, where the source's memory file has data, so
// the Sentry's copy while the source is frozen lands in pages that exist.
// Each fork gets its own copy of it (made while the fork's sandbox is
// created, after the source thawed): the checkpoint's stays as it was, for
// `shard restore` and later forks. The copy to disk (Persisted) keeps the
// file's holes.
const memoryFile = "memory.img"

// memoryHandoff says whether forks get their memory handed over here, and
// why not: the runsc here must be able to save a memory file copy and
// restore from one (the patched build; asked once), with a RAM directory
// for the copies, and the server not told otherwise.
func (p *Provider) memoryHandoff(ctx context.Context) (bool, string) {
	p.handoffOnce.Do(func() {
		// Not the caller's context: the answer is kept.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		// The patches of tools/runsc come as one build: the flags two of
		// them add stand for all of them (a root served after its create
		// too).
		restore, _ := exec.CommandContext(ctx, p.opts.Runsc, "help", "restore").CombinedOutput()
		create, _ := exec.CommandContext(ctx, p.opts.Runsc, "help", "create").CombinedOutput()
		if !strings.Contains(string(restore), "memory-file") || !strings.Contains(string(create), "setup-network") {
			p.unpatched = "runsc at " + p.opts.Runsc + " is not the patched build (no restore --memory-file, or no create --setup-network): build it with scripts/install-deps.sh"
		}
		switch {
		case p.opts.ForkMemory == provider.MemoryPages:
			p.noHandoff = "the server runs with --fork-memory pages"
		case p.opts.ImageRAM == "":
			p.noHandoff = "no RAM directory for images (--image-ram-dir none)"
		default:
			p.noHandoff = p.unpatched
		}
	})
	return p.noHandoff == "", p.noHandoff
}

// unpatchedRunsc says why runsc is not the patched build of tools/runsc,
// or "" when it is (asked once, with memoryHandoff).
func (p *Provider) unpatchedRunsc(ctx context.Context) string {
	p.memoryHandoff(ctx)
	return p.unpatched
}

// MemoryPath says how the memory of the image just written to dir reaches
// a restore, and why it takes the pages file when it does.
func (p *Provider) MemoryPath(dir string) (path, note string) {
	if st, ok := p.staged.LoadAndDelete(dir); ok { // a checkpoint that never paused
		st.(*stagedCopy).close()
	}
	v, _ := p.notes.LoadAndDelete(dir)
	if _, err := os.Lstat(filepath.Join(dir, memoryFile)); err == nil {
		return provider.MemoryHandoff, ""
	}
	note, _ = v.(string)
	return provider.MemoryPages, note
}

// ramInUse is what the files in the RAM directory hold: checkpoints'
// images not on disk yet, and forks' copies not yet restored.
func (p *Provider) ramInUse() int64 { return hostdir.Blocks(p.opts.ImageRAM) }

// ramBudget is the most the RAM directory may hold at once: a quarter of
// the host's memory (twice the most one sandbox may stage there).
func (p *Provider) ramBudget() int64 { return 2 * p.handoffMax() }

// handoffMax is the most memory a sandbox may hold for its checkpoint's
// copy to be staged in RAM: an eighth of the host's memory, at most 4 GiB.
// (The copy is in RAM until it is on disk, a few seconds; a fork's own copy
// is the fork's memory, which a load would fill as much.)
func (p *Provider) handoffMax() int64 {
	p.maxOnce.Do(func() {
		p.max = 512 << 20
		var si unix.Sysinfo_t
		if unix.Sysinfo(&si) == nil {
			p.max = min(int64(si.Totalram)*int64(si.Unit)/8, 4<<30)
		}
	})
	return p.max
}

// forkMemoryNote is what `shard capabilities` says of a fork's memory here.
func (p *Provider) forkMemoryNote(ctx context.Context) string {
	if ok, why := p.memoryHandoff(ctx); !ok {
		return "pages: each fork loads its memory page by page (" + why + ")"
	}
	return fmt.Sprintf("handoff: a fork adopts a copy of its source's frozen memory file, for sandboxes holding up to %d MiB (an eighth of the host's memory, at most 4 GiB); bigger ones load pages", p.handoffMax()>>20)
}

// stageMemoryCopy makes dir's memory.img: a file in RAM with pages
// allocated where sandbox id's memory file src has data now (the ranges a
// save writes, give or take what changes before the pause).
//
// It keeps src and the extents it allocated for topUp, which the pause
// calls: memory the source gains meanwhile must not land in pages the
// Sentry allocates, charged to the source.
func (p *Provider) stageMemoryCopy(id, dir string, src *os.File) error {
	ram := p.ramFile(dir) + ".mem"
	f, err := createLinked(filepath.Join(dir, memoryFile), ram)
	if err != nil {
		return err
	}
	defer f.Close()
	start, bytes := time.Now(), int64(0)
	st := &stagedCopy{ram: ram, extents: map[[2]int64]bool{}}
	err = forEachExtent(src, func(off, n int64) error {
		st.extents[[2]int64{off, n}] = true
		bytes += n
		// KEEP_SIZE: the Sentry sizes the file.
		return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, off, n)
	})
	p.opts.logger().Debug("memory copy staged", "sandbox", id, "extents", len(st.extents), "bytes", bytes, "took", time.Since(start))
	if err != nil {
		os.Remove(ram)
		os.Remove(filepath.Join(dir, memoryFile))
		return fmt.Errorf("room in RAM for the memory of %s: %w", id, err)
	}
	if fd, err := unix.Dup(int(src.Fd())); err == nil { // the caller closes its own
		st.src = os.NewFile(uintptr(fd), src.Name())
		if old, ok := p.staged.Swap(dir, st); ok {
			old.(*stagedCopy).close()
		}
	}
	return nil
}

// stagedCopy is a checkpoint's memory copy staged in RAM, waiting for the
// pause (topUp).
type stagedCopy struct {
	src     *os.File          // the source's memory file
	ram     string            // the copy
	extents map[[2]int64]bool // the source's extents allocated in it
}

func (st *stagedCopy) close() { st.src.Close() }

// topUp allocates in dir's staged copy the extents the source's memory file
// gained since it was staged: called while the source is paused, so the
// Sentry's copy then writes only into pages shard allocated (~1 ms for the
// ~200 extents of 256 MiB here, plus what is new).
func (p *Provider) topUp(dir string) {
	v, ok := p.staged.LoadAndDelete(dir)
	if !ok {
		return
	}
	st := v.(*stagedCopy)
	defer st.close()
	f, err := os.OpenFile(st.ram, os.O_RDWR, 0)
	if err != nil {
		return
	}
	defer f.Close()
	var added int64
	forEachExtent(st.src, func(off, n int64) error {
		if !st.extents[[2]int64{off, n}] {
			added += n
			unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, off, n) // best effort
		}
		return nil
	})
	if added > 0 {
		p.opts.logger().Debug("memory copy topped up", "dir", dir, "bytes", added)
	}
}

// sentryMemory opens sandbox id's memory file (the Sentry's memfd, through
// /proc as root), read-only.
func (p *Provider) sentryMemory(ctx context.Context, id string) (*os.File, error) {
	pid, err := p.sentryPID(ctx, id)
	if err != nil {
		return nil, err
	}
	fds := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	ents, err := os.ReadDir(fds)
	if err != nil {
		p.pids.Delete(id)
		return nil, err
	}
	// The memfd the Sentry made, or the copy it adopted at a restore, by
	// their exact names: the Sentry also holds files of the sandbox, whose
	// names the sandbox chooses (one named like the memory file, picked in
	// its place, made a fork stage the wrong extents and the source pay for
	// the copy). And on tmpfs, as both are.
	adopted := p.forkMemory(id)
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(fds, e.Name()))
		if err != nil || (target != "/memfd:runsc-memory (deleted)" && target != adopted+" (deleted)" && target != adopted) {
			continue
		}
		f, err := os.Open(filepath.Join(fds, e.Name()))
		if err != nil {
			return nil, err
		}
		var st unix.Statfs_t
		if unix.Fstatfs(int(f.Fd()), &st) == nil && st.Type == unix.TMPFS_MAGIC {
			return f, nil
		}
		f.Close()
	}
	p.pids.Delete(id)
	return nil, fmt.Errorf("sandbox %s: no memory file in process %d", id, pid)
}

// sentryPID is the pid of sandbox id's Sentry (runsc state's pid), kept
// once known: a runsc process costs tens of milliseconds before a freeze.
func (p *Provider) sentryPID(ctx context.Context, id string) (int, error) {
	if v, ok := p.pids.Load(id); ok {
		return v.(int), nil
	}
	pid, err := p.InitPID(ctx, id)
	if err != nil {
		return 0, err
	}
	p.pids.Store(id, pid)
	return pid, nil
}

// allocated is what f holds in memory (its blocks).
func allocated(f *os.File) int64 {
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

// forkMemory is where the fork inst.ID's own copy of a checkpoint's memory
// file waits for its restore.
func (p *Provider) forkMemory(id string) string {
	return filepath.Join(p.opts.ImageRAM, "fork-"+id+".mem")
}

// CopyMemoryCommand is the shard subcommand that runs CopyMemoryFile in a
// fork's memory cgroup (Options.CopyHelper).
const CopyMemoryCommand = "copy-memory"

// copyForkMemory copies dir's memory.img, if it has one, for the restore of
// sandbox id ("" if it has none). The copy is the fork's memory: with a
// CopyHelper it is made by a process in the fork's memory cgroup (which
// `runsc create`, running meanwhile, makes), so that the fork's cgroup
// holds its memory as it would after a load.
func (p *Provider) copyForkMemory(ctx context.Context, id, dir string) (string, error) {
	src := filepath.Join(dir, memoryFile)
	if _, err := os.Stat(src); errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err := os.MkdirAll(p.opts.ImageRAM, 0o700); err != nil {
		return "", err
	}
	path := p.forkMemory(id)
	var err error
	if p.opts.CopyHelper != "" {
		var out []byte
		out, err = exec.CommandContext(ctx, p.opts.CopyHelper, CopyMemoryCommand, "--cgroup", memoryCgroup(id), src, path).CombinedOutput()
		if err != nil {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
		}
	} else {
		err = CopyMemoryFile(path, src)
	}
	if err != nil {
		os.Remove(path)
		return "", fmt.Errorf("copy of the memory of checkpoint %s: %w", filepath.Base(dir), err)
	}
	return path, nil
}

// memoryCgroup is sandbox id's memory cgroup directory (cgroup v1's memory
// hierarchy, or the v2 one).
func memoryCgroup(id string) string {
	if st, err := os.Stat("/sys/fs/cgroup/memory"); err == nil && st.IsDir() {
		return filepath.Join("/sys/fs/cgroup/memory", oci.CgroupsPath(id))
	}
	return filepath.Join("/sys/fs/cgroup", oci.CgroupsPath(id))
}

// CopyMemoryFile copies the memory file src to a new file dst, its holes
// kept.
func CopyMemoryFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	err = copyExtents(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// copyExtents copies src's data to the same offsets of dst, leaving src's
// holes holes, and sizes dst as src: in the kernel (copy_file_range) when
// both are on tmpfs, else through a buffer (copy_file_range between two
// kinds of filesystem fails with EXDEV).
func copyExtents(dst, src *os.File) error {
	st, err := src.Stat()
	if err != nil {
		return err
	}
	if err := dst.Truncate(st.Size()); err != nil {
		return err
	}
	var buf []byte
	return forEachExtent(src, func(off, n int64) error {
		for n > 0 && buf == nil {
			roff, woff := off, off
			c, err := unix.CopyFileRange(int(src.Fd()), &roff, int(dst.Fd()), &woff, int(n), 0)
			switch {
			case errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP):
				buf = make([]byte, 1<<20) // and on below, from off
			case err != nil:
				return err
			case c <= 0:
				return io.ErrUnexpectedEOF
			default:
				off += int64(c)
				n -= int64(c)
			}
		}
		for n > 0 {
			b := buf[:min(int64(len(buf)), n)]
			if _, err := src.ReadAt(b, off); err != nil {
				return err
			}
			if _, err := dst.WriteAt(b, off); err != nil {
				return err
			}
			off += int64(len(b))
			n -= int64(len(b))
		}
		return nil
	})
}

// forEachExtent calls fn with each range of f that holds data (SEEK_DATA,
// SEEK_HOLE), in order.
func forEachExtent(f *os.File, fn func(off, n int64) error) error {
	fd := int(f.Fd())
	var off int64
	for {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // no data past off
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if err := fn(data, hole-data); err != nil {
			return err
		}
		off = hole
	}
}

// handoffState is the provider's memory handoff bookkeeping.
type handoffState struct {
	handoffOnce sync.Once
	noHandoff   string // why not, or "" when forks get their memory handed over
	unpatched   string // why runsc is not the patched build, or ""
	maxOnce     sync.Once
	max         int64    // handoffMax
	pids        sync.Map // sandbox id -> Sentry pid
	notes       sync.Map // checkpoint dir -> why its memory takes the pages file
	staged      sync.Map // checkpoint dir -> *stagedCopy, until its pause
}
