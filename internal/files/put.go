package files

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/useshards/shard/internal/sparse"
)

// PutOptions say how Put writes.
type PutOptions struct {
	Tar     bool      // the input is a tar to unpack into the directory p (made if missing)
	Mode    int64     // a file's mode (07777); -1: the replaced file's, or 0644
	UID     int       // a file's owner; -1: the replaced file's, or root
	GID     int       // -1 as UID
	MTime   time.Time // a file's modification time; zero: now
	Size    int64     // the input's length when known (-1): a shorter input writes nothing
	Parents bool      // make a file's missing parent directories
	// Sparse: the input of a file is a tar of it, one entry, which may be
	// sparse (package sparse): its holes stay holes. Only the entry's
	// data is used; the file's mode, owner and time are as without.
	Sparse bool
}

// maxNotes bounds the notes a Result carries.
const maxNotes = 100

// Put writes what r holds at p: one file, replaced whole (written beside it
// and renamed over it, so a reader never sees half of it and a failure
// leaves the old one), or with Tar the entries of an archive under the
// directory p. Cancelling ctx (the helper's SIGTERM) stops it and removes
// the file being written.
func Put(ctx context.Context, r io.Reader, p string, o PutOptions) Result {
	clean, err := CheckPath(p)
	if err != nil {
		return Failed(err)
	}
	r = &ctxReader{ctx: ctx, r: r}
	if o.Tar {
		return putTar(r, clean)
	}
	if NamesDir(p) {
		return Failed(fileAtDir(p, clean))
	}
	return putFile(r, clean, o)
}

// fileAtDir is why a file is not written at p, which names a directory
// (ends in / or /.), as the kernel refuses to create one there.
func fileAtDir(p, clean string) error {
	if err := notDir(p, clean); err != nil {
		return err
	}
	if fi, err := os.Stat(clean); err == nil && fi.IsDir() {
		return fail(CodeIsDir, "%s is a directory: copy a file into it by its name (%s/NAME), or send a tar", clean, clean)
	}
	return fail(CodeNotFound, "directory %s does not exist: a file is written at a path that does not end in /", clean)
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, fail(CodeShortBody, "the upload was cancelled")
	}
	return c.r.Read(p)
}

// resolve follows p while it is a symlink (a write through a link writes
// what it names, as a shell's > does), at most 40 times.
func resolve(p string) (string, error) {
	for range 40 {
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			return p, nil
		}
		t, err := os.Readlink(p)
		if err != nil {
			return "", pathErr(p, err)
		}
		if !path.IsAbs(t) {
			t = path.Join(path.Dir(p), t)
		}
		p = path.Clean(t)
	}
	return "", fail(CodeInvalid, "%s: too many levels of symbolic links", p)
}

func putFile(r io.Reader, p string, o PutOptions) Result {
	if p == "/" {
		return Failed(fail(CodeIsDir, "/ is a directory"))
	}
	target, err := resolve(p)
	if err != nil {
		return Failed(err)
	}
	mode, uid, gid, err := putAttrs(p, target, o)
	if err != nil {
		return Failed(err)
	}
	dir := path.Dir(target)
	if err := putDir(dir, o.Parents); err != nil {
		return Failed(err)
	}
	tmp, err := os.CreateTemp(dir, ".shard-write-*")
	if err != nil {
		return Failed(pathErr(dir, err))
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	n, err := putBody(tmp, r, o.Sparse)
	if err != nil {
		return Failed(writeErr(p, n, err))
	}
	if o.Size >= 0 && n != o.Size {
		return Failed(fail(CodeShortBody, "%s: the upload ended after %d of its %d bytes: nothing was written", p, n, o.Size))
	}
	if uid >= 0 || gid >= 0 {
		if err := tmp.Chown(uid, gid); err != nil {
			return Failed(pathErr(p, err))
		}
	}
	// After the chown, which clears setuid and setgid.
	if err := tmp.Chmod(mode); err != nil {
		return Failed(pathErr(p, err))
	}
	if !o.MTime.IsZero() {
		if err := os.Chtimes(tmp.Name(), time.Time{}, o.MTime); err != nil {
			return Failed(pathErr(p, err))
		}
	}
	if err := syncClose(tmp); err != nil {
		return Failed(writeErr(p, n, err))
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		return Failed(pathErr(p, err))
	}
	done = true
	if err := syncDir(dir); err != nil {
		return Failed(fail(classify(err), "%s was replaced, but the disk did not take its new name (%v): it may not be kept", p, unwrapErrno(err)))
	}
	return Result{OK: true, Bytes: n, Files: 1}
}

// putBody writes the upload r into the new file f: its bytes, or with
// tarOfOne the data of the one file the tar r holds, its holes kept.
func putBody(f *os.File, r io.Reader, tarOfOne bool) (int64, error) {
	buf := make([]byte, copyBuf)
	if !tarOfOne {
		return copyFull(f, r, buf)
	}
	tr := tar.NewReader(r)
	hdr, err := tr.Next()
	if err != nil {
		return 0, archiveErr(err, "it holds no file")
	}
	if hdr.Typeflag != tar.TypeReg && hdr.Typeflag != '\x00' {
		return 0, fail(CodeBadArchive, "a sparse upload is a tar of one regular file: its entry %q is not one", hdr.Name)
	}
	n, err := writeData(f, hdr, tr, buf, false)
	if err != nil {
		return n, archiveErr(err, "it ends inside the file")
	}
	if _, err := tr.Next(); err != io.EOF {
		return n, archiveErr(err, "it holds more than one file")
	}
	// Whatever follows the archive's end (padding) is read, so the sender
	// is not left blocked.
	io.Copy(io.Discard, r)
	return n, nil
}

// archiveErr is why a sparse upload's tar is refused: a failure with its
// code as it is (a cut upload, a full disk), else a bad archive.
func archiveErr(err error, why string) error {
	var fe *Error
	if errors.As(err, &fe) || isErrno(err) {
		return err
	}
	if err != nil && err != io.EOF {
		why = err.Error()
	}
	return fail(CodeBadArchive, "a sparse upload is a tar of one regular file: %s", why)
}

// syncClose puts f on the disk, then closes it. A write is acknowledged
// only once it is on the disk: a sandbox's filesystem is an image in the
// sandbox store, and a write the store cannot take (full, or an I/O error
// under the sandbox's filesystem) fails only when it is written back. Left
// in the page cache, it closes and renames without an error, and the file
// then reads as zeros of its full size once the cache lets it go.
func syncClose(f *os.File) error {
	err := f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// syncDir puts the names in directory dir on the disk (a file's new name).
// A filesystem that cannot sync a directory (EINVAL) keeps them anyway.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	d.Close()
	if errors.Is(err, syscall.EINVAL) {
		return nil
	}
	return err
}

// putAttrs is the mode and owner the file at target gets: those of the
// file it replaces (a new one: 0644, the writer's), then o's.
func putAttrs(p, target string, o PutOptions) (mode fs.FileMode, uid, gid int, err error) {
	mode, uid, gid = 0o644, -1, -1
	if fi, err := os.Stat(target); err == nil {
		if fi.IsDir() {
			return 0, 0, 0, fail(CodeIsDir, "%s is a directory: copy a file into it by its name (%s/NAME), or send a tar", p, p)
		}
		if !fi.Mode().IsRegular() {
			return 0, 0, 0, fail(CodeNotRegular, "%s is not a regular file (%s): remove it first", p, infoOf(target, fi).Type)
		}
		mode = fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			uid, gid = int(st.Uid), int(st.Gid)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return 0, 0, 0, pathErr(p, err)
	}
	if o.Mode >= 0 {
		mode = goMode(uint32(o.Mode))
	}
	if o.UID >= 0 {
		uid = o.UID
	}
	if o.GID >= 0 {
		gid = o.GID
	}
	return mode, uid, gid, nil
}

// putDir checks that dir is a directory, made first (with its parents)
// when asked.
func putDir(dir string, parents bool) error {
	if parents {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return pathErr(dir, err)
		}
	}
	if fi, err := os.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fail(CodeNotFound, "directory %s does not exist (make it first, or ask for its parents: parents=true in the API, shard write --parents)", dir)
		}
		return pathErr(dir, err)
	} else if !fi.IsDir() {
		return fail(CodeNotDir, "%s is not a directory", dir)
	}
	return nil
}

// writeErr says why writing p failed after n bytes.
func writeErr(p string, n int64, err error) error {
	var fe *Error
	if errors.As(err, &fe) {
		return err
	}
	if classify(err) == CodeDiskFull {
		return fail(CodeDiskFull, "%s: the disk is full after %d bytes: nothing was written", p, n)
	}
	return pathErr(p, err)
}

// escapes reports an os.Root refusal of a name that leads out of the root
// (os has no exported error for it).
func escapes(err error) bool {
	return err != nil && strings.Contains(err.Error(), "path escapes from parent")
}

// unpacker unpacks one archive into a directory.
type unpacker struct {
	root  *os.Root
	dest  string
	opts  UnpackOptions
	res   Result
	dirs  []dirTime // directories' times, set last (their entries change them)
	buf   []byte
	notes int             // notes left out past maxNotes
	links map[string]bool // the symlinks this archive made: nothing is made through one
	sy    *syncer         // with Sync: puts the files it writes on the disk
}

type dirTime struct {
	name  string
	mtime time.Time
}

func (u *unpacker) note(format string, args ...any) {
	if len(u.res.Notes) < maxNotes {
		u.res.Notes = append(u.res.Notes, fmt.Sprintf(format, args...))
	} else {
		u.notes++
	}
}

func putTar(r io.Reader, p string) Result {
	if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
		return Failed(fail(CodeNotDir, "%s is not a directory: a tar unpacks into a directory", p))
	}
	if err := os.MkdirAll(p, 0o755); err != nil {
		return Failed(pathErr(p, err))
	}
	res := Unpack(r, p, UnpackOptions{KeepOwner: true, Sync: true})
	// Whatever follows the archive's end (padding) is read, so the sender
	// is not left blocked.
	io.Copy(io.Discard, r)
	return res
}

// UnpackOptions say how Unpack names and owns what it makes.
type UnpackOptions struct {
	// Rename maps an entry's name (cleaned, relative) to the name it gets
	// under the destination; false leaves the entry out. Nil keeps names.
	Rename func(name string) (string, bool)
	// KeepOwner gives entries the owner the archive says (as root);
	// otherwise they belong to whoever unpacks.
	KeepOwner bool
	// Holes leaves the blocks of zeros of a file sent whole holes, as a
	// sparse entry's are: what is written is the data the archive
	// carries, never more, whatever the sender (a sandbox) did.
	Holes bool
	// Sync puts the files on the disk before the unpack says it is done
	// (see syncClose); one that the disk did not take is removed and the
	// unpack fails.
	Sync bool
}

// Unpack unpacks the tar r into the directory dest, which must exist.
// Nothing it makes can be outside dest: an entry named out of it, a hard
// link to outside, or a path through a symlink that leads out is refused
// (os.Root); device nodes and FIFOs are skipped and setuid and setgid bits
// of files removed, each said in Notes. What was made before a refused or
// broken entry stays, and the failure says how much that was.
func Unpack(r io.Reader, dest string, o UnpackOptions) Result {
	root, err := os.OpenRoot(dest)
	if err != nil {
		return Failed(pathErr(dest, err))
	}
	defer root.Close()
	u := &unpacker{root: root, dest: dest, opts: o, res: Result{OK: true}, buf: make([]byte, copyBuf), links: map[string]bool{}}
	if o.Sync {
		u.sy = newSyncer()
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			var fe *Error
			if errors.As(err, &fe) {
				return u.failed(err)
			}
			return u.failed(fail(CodeBadArchive, "the archive is not a valid tar after %d entries: %v", u.res.Files, err))
		}
		if err := u.entry(tr, hdr); err != nil {
			return u.failed(err)
		}
	}
	if err := u.sync(); err != nil {
		return u.failed(err)
	}
	slices.Reverse(u.dirs) // deepest last made, first set
	for _, d := range u.dirs {
		root.Chtimes(d.name, time.Time{}, d.mtime)
	}
	if u.notes > 0 {
		u.res.Notes = append(u.res.Notes, fmt.Sprintf("and %d more", u.notes))
	}
	return u.res
}

// failed is the Result of an unpack that stopped at an entry: what was
// made before it stays (on the disk, with Sync), and the message says how
// much that was.
func (u *unpacker) failed(err error) Result {
	u.sync() // what it says of the files before is less than err
	res := Failed(err)
	if u.res.Files > 0 {
		res.Message += fmt.Sprintf(" (%d entries before it were unpacked into %s)", u.res.Files, u.dest)
	}
	res.Files, res.Bytes = u.res.Files, u.res.Bytes
	return res
}

// entryName is hdr's name relative to the destination, or "" for the
// destination itself; a name that climbs out of it is refused.
func entryName(name string) (string, error) {
	n := strings.TrimLeft(name, "/")
	n = path.Clean("/" + n)[1:]
	if n == "" {
		return "", nil
	}
	for _, el := range strings.Split(strings.TrimLeft(name, "/"), "/") {
		if el == ".." {
			return "", fail(CodeUnsafe, "entry %q climbs out of the destination (..): refused", name)
		}
	}
	if strings.IndexByte(n, 0) >= 0 || len(n) > MaxPath {
		return "", fail(CodeUnsafe, "entry %q has a name no file can have", name)
	}
	return n, nil
}

func (u *unpacker) entry(tr *tar.Reader, hdr *tar.Header) error {
	name, err := entryName(hdr.Name)
	if err != nil {
		return err
	}
	if u.opts.Rename != nil {
		var keep bool
		if name, keep = u.opts.Rename(name); !keep {
			return nil
		}
		if name, err = entryName(name); err != nil {
			return err
		}
	}
	// A symlink the archive made is made as written, and nothing is made
	// through it, whatever it names: os.Root only keeps entries inside
	// dest, and a link to ".." lets "top/link/x" land beside what the
	// caller asked for (a copy out to a new directory unpacks into its
	// parent).
	if l := u.throughLink(name); l != "" {
		return fail(CodeUnsafe, "entry %q is under %s, a symlink the archive made: refused", hdr.Name, path.Join(u.dest, l))
	}
	mode := u.mode(hdr)
	made := false
	switch hdr.Typeflag {
	case tar.TypeDir:
		made, err = u.dir(hdr, name)
	case tar.TypeReg, tar.TypeGNUSparse, '\x00':
		made, err = true, u.file(tr, hdr, name, mode)
	case tar.TypeSymlink:
		made, err = true, u.symlink(hdr, name)
	case tar.TypeLink:
		made, err = u.hardlink(hdr, name)
	case tar.TypeChar, tar.TypeBlock:
		u.note("%s: a device node, skipped (shard makes no device nodes)", hdr.Name)
	case tar.TypeFifo:
		u.note("%s: a FIFO, skipped", hdr.Name)
	case tar.TypeXGlobalHeader:
	default:
		u.note("%s: entry type %q skipped", hdr.Name, hdr.Typeflag)
	}
	if err != nil {
		return err
	}
	if made {
		u.res.Files++
	}
	return nil
}

// mode is hdr's permission bits, without setuid and setgid on what is not
// a directory (said in a note).
func (u *unpacker) mode(hdr *tar.Header) uint32 {
	mode := uint32(hdr.Mode) & 0o7777
	if mode&0o6000 != 0 && hdr.Typeflag != tar.TypeDir {
		u.note("%s: setuid/setgid bit removed", hdr.Name)
		mode &^= 0o6000
	}
	return mode
}

// dir makes directory name; made is false for the destination itself.
func (u *unpacker) dir(hdr *tar.Header, name string) (made bool, err error) {
	if name == "" {
		// The destination itself ("./"): it keeps its own owner and
		// mode (a copy into /tmp must not take /tmp's sticky bit).
		return false, nil
	}
	if err := u.root.MkdirAll(path.Dir(name), 0o755); err != nil {
		return false, u.entryErr(hdr, err)
	}
	if err := u.root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return false, u.entryErr(hdr, err)
	}
	if fi, err := u.root.Lstat(name); err != nil || !fi.IsDir() {
		return false, fail(CodeNotDir, "entry %q: %s is in the way and is not a directory", hdr.Name, path.Join(u.dest, name))
	}
	u.attrs(name, hdr, uint32(hdr.Mode)&0o3777) // setgid on a directory only passes its group on
	u.dirs = append(u.dirs, dirTime{name, hdr.ModTime})
	return true, nil
}

// file writes regular file name from tr.
func (u *unpacker) file(tr *tar.Reader, hdr *tar.Header, name string, mode uint32) error {
	if name == "" {
		return fail(CodeUnsafe, "entry %q is a file in place of the destination directory", hdr.Name)
	}
	if err := u.clear(name, hdr); err != nil {
		return err
	}
	f, err := u.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return u.entryErr(hdr, err)
	}
	n, err := writeData(f, hdr, tr, u.buf, u.opts.Holes)
	if err == nil && u.sy == nil {
		err = f.Close()
	}
	if err != nil {
		f.Close()
		u.root.Remove(name)
		var fe *Error
		if errors.As(err, &fe) {
			return err
		}
		if classify(err) == CodeDiskFull {
			return fail(CodeDiskFull, "entry %q: the disk is full after %d bytes of it", hdr.Name, n)
		}
		if classify(err) == CodeIO && !isErrno(err) {
			return fail(CodeBadArchive, "entry %q: the archive ends inside it: %v", hdr.Name, err)
		}
		return u.entryErr(hdr, err)
	}
	u.res.Bytes += n
	u.attrs(name, hdr, mode)
	if !hdr.ModTime.IsZero() {
		u.root.Chtimes(name, time.Time{}, hdr.ModTime)
	}
	if u.sy != nil {
		u.sy.add(name, f)
	}
	return nil
}

// writeData writes an entry's data into f, a new file: a sparse entry's
// extents where its records say, the rest left holes (package sparse), or
// else all of it (its blocks of zeros left holes too, with holes); n is
// the bytes of data written, not the file's size. What is written is the
// data the archive carries, whatever size it claims.
func writeData(f *os.File, hdr *tar.Header, r io.Reader, buf []byte, holes bool) (n int64, err error) {
	size, ext, ok, err := sparse.FromHeader(hdr)
	if err != nil {
		return 0, fail(CodeBadArchive, "entry %v", err)
	}
	if !ok && holes {
		w := sparse.NewHoleWriter(f)
		if n, err = copyFull(w, r, buf); err == nil {
			err = w.Close()
		}
		return n, err
	}
	if !ok {
		return copyFull(f, r, buf)
	}
	for _, x := range ext {
		k, err := copyFull(io.NewOffsetWriter(f, x[0]), io.LimitReader(r, x[1]), buf)
		n += k
		if err == nil && k < x[1] {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return n, tooLarge(hdr, size, err)
		}
	}
	return n, tooLarge(hdr, size, f.Truncate(size))
}

// tooLarge says so of err when the file system holds no file of size
// bytes (EFBIG: a sparse entry may claim any size).
func tooLarge(hdr *tar.Header, size int64, err error) error {
	if errors.Is(err, syscall.EFBIG) {
		return fail(CodeTooLarge, "entry %q is %d bytes, past the largest file the filesystem holds", hdr.Name, size)
	}
	return err
}

// syncer puts an unpack's files on the disk (UnpackOptions.Sync): each
// file is handed over once written and synced in the background while the
// unpack goes on, syncWorkers at once. Each fsync flushes the disk under the
// sandbox's filesystem (a loop device, the store's filesystem, another loop
// device, the host's disk): one after another they took longer than the
// unpack, and flushes in flight together are done as one.
type syncer struct {
	jobs chan syncJob
	wg   sync.WaitGroup
	n    int // files handed over (the next one's index)

	mu   sync.Mutex
	lost []syncJob // files the disk did not take; guarded by mu
}

type syncJob struct {
	i    int // in the order written
	name string
	f    *os.File
	fi   fs.FileInfo // which file it was (a later entry may take its name)
	err  error
}

// syncWorkers is how many files a syncer syncs at once; as many more wait,
// open, for their turn.
const syncWorkers = 32

func newSyncer() *syncer {
	s := &syncer{jobs: make(chan syncJob, syncWorkers)}
	for range syncWorkers {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for j := range s.jobs {
				j.fi, _ = j.f.Stat()
				j.err = j.f.Sync()
				j.f.Close()
				if j.err != nil {
					s.mu.Lock()
					s.lost = append(s.lost, j)
					s.mu.Unlock()
				}
			}
		}()
	}
	return s
}

// add hands the written file f (named name) over, to sync and close.
func (s *syncer) add(name string, f *os.File) {
	s.jobs <- syncJob{i: s.n, name: name, f: f}
	s.n++
}

// sync waits until the files handed over are synced (with UnpackOptions.
// Sync; else there are none). A file the disk did not take is removed (it
// would read as zeros); the first in the archive's order is the error.
func (u *unpacker) sync() error {
	if u.sy == nil {
		return nil
	}
	s := u.sy
	u.sy = nil
	close(s.jobs)
	s.wg.Wait()
	slices.SortFunc(s.lost, func(a, b syncJob) int { return a.i - b.i })
	var first *Error
	for _, j := range s.lost {
		if fi, err := u.root.Lstat(j.name); err == nil && j.fi != nil && os.SameFile(fi, j.fi) {
			u.root.Remove(j.name)
		}
		if first == nil {
			first = fail(classify(j.err), "%s: the disk did not take it (%v): removed", path.Join(u.dest, j.name), unwrapErrno(j.err))
		}
	}
	if first == nil {
		return nil
	}
	if len(s.lost) > 1 {
		first.Msg += fmt.Sprintf(", and %d more files like it", len(s.lost)-1)
	}
	return first
}

// symlink makes symlink name as written.
func (u *unpacker) symlink(hdr *tar.Header, name string) error {
	if name == "" {
		return fail(CodeUnsafe, "entry %q is a symlink in place of the destination directory", hdr.Name)
	}
	if err := u.clear(name, hdr); err != nil {
		return err
	}
	// The target is the sandbox's business: the link is made as written,
	// and nothing below is written through a link that leads out of the
	// destination (os.Root refuses that).
	if err := u.root.Symlink(hdr.Linkname, name); err != nil {
		return u.entryErr(hdr, err)
	}
	u.links[name] = true
	if u.opts.KeepOwner && hdr.Uid >= 0 && hdr.Gid >= 0 {
		u.root.Lchown(name, hdr.Uid, hdr.Gid)
	}
	return nil
}

// hardlink links name to an entry made before; made is false for a link
// to what a rename left out.
func (u *unpacker) hardlink(hdr *tar.Header, name string) (made bool, err error) {
	old, err := entryName(hdr.Linkname)
	if err != nil || old == "" {
		return false, fail(CodeUnsafe, "entry %q is a hard link to %q, outside the archive's directory: refused", hdr.Name, hdr.Linkname)
	}
	if u.opts.Rename != nil {
		var keep bool
		if old, keep = u.opts.Rename(old); !keep || old == "" {
			u.note("%s: a hard link to %s, which is not copied: skipped", hdr.Name, hdr.Linkname)
			return false, nil
		}
	}
	if l := u.throughLink(old); l != "" || u.links[old] {
		return false, fail(CodeUnsafe, "entry %q is a hard link through a symlink the archive made (%s): refused", hdr.Name, hdr.Linkname)
	}
	if err := u.clear(name, hdr); err != nil {
		return false, err
	}
	if err := u.root.Link(old, name); err != nil {
		if escapes(err) {
			return false, fail(CodeUnsafe, "entry %q is a hard link to %q, outside the archive's directory: refused", hdr.Name, hdr.Linkname)
		}
		return false, u.entryErr(hdr, err)
	}
	return true, nil
}

// throughLink is the symlink this archive made that name is under, if any.
func (u *unpacker) throughLink(name string) string {
	for p := path.Dir(name); p != "." && p != "/" && p != ""; p = path.Dir(p) {
		if u.links[p] {
			return p
		}
	}
	return ""
}

func isErrno(err error) bool {
	var errno syscall.Errno
	return errors.As(err, &errno)
}

// clear removes what is at name before a file, link or symlink is made
// there (as tar does): never a directory that holds anything.
func (u *unpacker) clear(name string, hdr *tar.Header) error {
	if dir := path.Dir(name); dir != "." {
		if err := u.root.MkdirAll(dir, 0o755); err != nil {
			return u.entryErr(hdr, err)
		}
	}
	fi, err := u.root.Lstat(name)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return u.entryErr(hdr, err)
	}
	delete(u.links, name)
	if err := u.root.Remove(name); err != nil {
		if fi.IsDir() {
			return fail(CodeNotEmpty, "entry %q: %s is a directory that is not empty", hdr.Name, path.Join(u.dest, name))
		}
		return u.entryErr(hdr, err)
	}
	return nil
}

// attrs gives name hdr's owner, then mode (a chown clears setuid bits).
// A failure to set them is not fatal; it is noted.
func (u *unpacker) attrs(name string, hdr *tar.Header, mode uint32) {
	n := name
	if u.opts.KeepOwner && hdr.Uid >= 0 && hdr.Gid >= 0 {
		if err := u.root.Lchown(n, hdr.Uid, hdr.Gid); err != nil {
			u.note("%s: owner not set: %v", hdr.Name, unwrapErrno(err))
		}
	}
	if err := u.root.Chmod(n, goMode(mode)); err != nil {
		u.note("%s: mode not set: %v", hdr.Name, unwrapErrno(err))
	}
}

func (u *unpacker) entryErr(hdr *tar.Header, err error) error {
	if escapes(err) {
		return fail(CodeUnsafe, "entry %q leads out of the destination through a symlink: refused", hdr.Name)
	}
	code := classify(err)
	if code == CodeDiskFull {
		return fail(code, "entry %q: the disk is full", hdr.Name)
	}
	return fail(code, "entry %q: %v", hdr.Name, unwrapErrno(err))
}

// copyFull copies r to w in writes of buf's size (but the last), by plain
// reads and writes. Full writes: a pipe's reads come in pieces, and each
// write into a gVisor sandbox's file is a trip through its Sentry and
// gofer. Never ReadFrom or WriteTo: in a gVisor sandbox the splice and
// sendfile those choose moved a file into a pipe ten times slower.
func copyFull(w io.Writer, r io.Reader, buf []byte) (int64, error) {
	var n int64
	for {
		k := 0
		var rerr error
		for k < len(buf) && rerr == nil {
			var m int
			m, rerr = r.Read(buf[k:])
			k += m
		}
		if k > 0 {
			m, werr := w.Write(buf[:k])
			n += int64(m)
			if werr != nil {
				return n, werr
			}
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}
