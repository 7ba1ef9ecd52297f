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
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/useshards/shard/internal/sparse"
)

func sortInfos(in []Info) {
	slices.SortFunc(in, func(a, b Info) int { return strings.Compare(a.Name, b.Name) })
}

// copyBuf is the size of the reads and writes that move a file's bytes:
// few trips through a gVisor Sentry, and a bounded amount in flight.
const copyBuf = 1 << 20

// GetOptions say what Get writes.
type GetOptions struct {
	Tar    bool // a tar of the path, not a file's bytes
	Follow bool // a tar's path that is a symlink is archived as what it names
	Sparse bool // a tar's files that have holes are sent as their data (TarOptions)
	// ReadHoles finds a tar's files' holes by reading them (TarOptions).
	ReadHoles bool
}

// Get writes to w the Result line, then the bytes of file p (following
// symlinks, as cat does) or, with o.Tar, a tar of p: a directory with all
// it holds, named from p's last element. A symlink is archived as one,
// except p itself with o.Follow. A failure before the first byte is a
// failed Result (and Get returns nil); the error it returns is one that
// came after the bytes began, or a write to w that failed. Once ctx is
// done (its reader gone: WatchOutput) it stops.
func Get(ctx context.Context, w io.Writer, p string, o GetOptions) error {
	clean, err := CheckPath(p)
	if err == nil {
		err = notDir(p, clean)
	}
	if err != nil {
		return WriteResult(w, Failed(err))
	}
	if !o.Tar {
		return getFile(w, clean)
	}
	return getTar(ctx, w, clean, o)
}

func getFile(w io.Writer, p string) error {
	// What p is before it is opened: opening a FIFO waits for a writer
	// (forever, holding a stopped sandbox's lock), and opening a device
	// node reaches the device (on the host, for a stopped sandbox whose
	// files hold one a runc sandbox made with mknod).
	if fi, err := os.Stat(p); err != nil {
		return WriteResult(w, Failed(pathErr(p, err)))
	} else if !fi.IsDir() && !fi.Mode().IsRegular() {
		return WriteResult(w, Failed(fail(CodeNotRegular, "%s is not a regular file (%s)", p, infoOf(p, fi).Type)))
	}
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return WriteResult(w, Failed(pathErr(p, err)))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return WriteResult(w, Failed(pathErr(p, err)))
	}
	if fi.IsDir() {
		return WriteResult(w, Failed(fail(CodeIsDir, "%s is a directory: ask for a tar of it (shard cp), or list it (shard ls)", p)))
	}
	if !fi.Mode().IsRegular() {
		return WriteResult(w, Failed(fail(CodeNotRegular, "%s is not a regular file (%s)", p, infoOf(p, fi).Type)))
	}
	in := infoOf(p, fi)
	if err := WriteResult(w, Result{OK: true, Info: &in}); err != nil {
		return err
	}
	// Exactly the size the answer gave: a file that grows meanwhile (a log)
	// is cut there, one that shrinks fails the read.
	n, err := copyFull(w, io.LimitReader(f, in.Size), make([]byte, copyBuf))
	if err == nil && n < in.Size {
		err = fmt.Errorf("%s shrank from %d to %d bytes while it was read", p, in.Size, n)
	}
	return err
}

func getTar(ctx context.Context, w io.Writer, p string, o GetOptions) error {
	fi, err := os.Lstat(p)
	if err == nil && o.Follow && fi.Mode()&fs.ModeSymlink != 0 {
		fi, err = os.Stat(p)
	}
	if err != nil {
		return WriteResult(w, Failed(pathErr(p, err)))
	}
	in := infoOf(p, fi)
	if err := WriteResult(w, Result{OK: true, Info: &in}); err != nil {
		return err
	}
	// With follow the walk starts where p leads, and its entries are
	// named from p.
	root := p
	if o.Follow {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			root = r
		}
	}
	base := path.Base(p)
	if p == "/" {
		base = "."
	}
	return WriteTar(ctx, w, root, base, TarOptions{Sparse: o.Sparse, ReadHoles: o.ReadHoles})
}

// TarOptions say how WriteTar archives.
type TarOptions struct {
	// ContentsOnly leaves root itself out: what it holds is named from
	// "." (a copy of its contents).
	ContentsOnly bool
	// Sparse sends a file that has holes as its data, in the sparse form
	// of package sparse, which only shard unpacks (Unpack): its holes are
	// neither read nor sent, and stay holes where it is unpacked.
	Sparse bool
	// ReadHoles finds the holes of a sparse file by reading it, where
	// neither SEEK_DATA nor st_blocks say where they are (inside gVisor):
	// blocks of zeros are holes then.
	ReadHoles bool
}

// WriteTar writes a tar of root (a directory with all it holds, or one
// file; a symlink as one) to w, its entries named from base. Owners are
// numeric only; a file that has several links is archived once, the
// others as hard links to it. It stops with ctx's error once ctx is done.
func WriteTar(ctx context.Context, w io.Writer, root, base string, o TarOptions) error {
	if o.ContentsOnly {
		base = "."
	}
	tw := &tarWriter{tw: tar.NewWriter(w), links: map[fileKey]string{}, buf: make([]byte, copyBuf), opts: o}
	err := filepath.WalkDir(root, func(fp string, d fs.DirEntry, err error) error {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && fp != root {
				return nil // removed meanwhile
			}
			return err
		}
		if o.ContentsOnly && fp == root {
			return nil
		}
		rel, _ := filepath.Rel(root, fp)
		name := path.Join(base, filepath.ToSlash(rel))
		fi, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if err := tw.add(ctx, fp, name, fi); err != nil {
			return err
		}
		if d.IsDir() && !fi.IsDir() {
			// The directory listing said a directory and it is now
			// something else (a symlink swapped in): WalkDir would read
			// what the symlink names under this name.
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.tw.Close()
}

type fileKey struct{ dev, ino uint64 }

// namelessInfo keeps tar.FileInfoHeader from looking owners' names up
// (archives carry numeric owners only): a lookup reads the sandbox's
// /etc/passwd, and through a C library's name services, which a build with
// cgo has, would load the shared modules the sandbox's files provide.
type namelessInfo struct{ fs.FileInfo }

func (namelessInfo) Uname() (string, error) { return "", nil }
func (namelessInfo) Gname() (string, error) { return "", nil }

type tarWriter struct {
	tw    *tar.Writer
	links map[fileKey]string // a file with more than one link: its first name
	buf   []byte
	opts  TarOptions
}

func (t *tarWriter) add(ctx context.Context, fp, name string, fi fs.FileInfo) error {
	if fi.Mode()&fs.ModeSocket != 0 {
		return nil // a tar cannot hold one
	}
	link := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		var err error
		if link, err = os.Readlink(fp); err != nil {
			return err
		}
	}
	hdr, err := tar.FileInfoHeader(namelessInfo{fi}, link)
	if err != nil {
		return err
	}
	hdr.Name = name
	// Whole seconds, truncated (as docker cp): archive/tar rounds a
	// header's time to the nearest second, which put a copy's time after
	// its source's, and keeping the nanoseconds in PAX records costs 1 KiB
	// an entry (12-15% more bytes for a tree of sources). The access and
	// change times are not restored: a PAX entry (a sparse file) would
	// carry them for nothing.
	hdr.ModTime = hdr.ModTime.Truncate(time.Second)
	hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
	if fi.IsDir() {
		hdr.Name += "/"
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() && st.Nlink > 1 {
		k := fileKey{uint64(st.Dev), st.Ino}
		if first, ok := t.links[k]; ok {
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			return t.tw.WriteHeader(hdr)
		}
		t.links[k] = name
	}
	if !fi.Mode().IsRegular() {
		return t.tw.WriteHeader(hdr)
	}
	// O_NOFOLLOW: a file swapped for a symlink since the walk saw it is
	// not followed; the archive holds what the walk saw or nothing.
	f, err := os.OpenFile(fp, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ELOOP) {
			return nil
		}
		return err
	}
	defer f.Close()
	if t.opts.Sparse {
		ext, holes, err := holesOf(ctx, f, fi, t.buf, t.opts.ReadHoles)
		if err != nil {
			return err
		}
		if holes {
			return t.addData(f, hdr, ext)
		}
	}
	return t.addData(f, hdr, sparse.Extents{{0, hdr.Size}})
}

// addData writes the entry of a regular file whose data are ext: all of it
// (one extent from 0 to its size), or with holes between them, as sparse
// records say.
func (t *tarWriter) addData(f *os.File, hdr *tar.Header, ext sparse.Extents) error {
	if len(ext) != 1 || ext[0] != [2]int64{0, hdr.Size} {
		sparse.Header(hdr, hdr.Size, ext)
	}
	if err := t.tw.WriteHeader(hdr); err != nil {
		return err
	}
	for _, x := range ext {
		n, err := copyFull(t.tw, io.NewSectionReader(f, x[0], x[1]), t.buf)
		if err != nil {
			return err
		}
		// A file that shrank while it was read is padded with zeros: the
		// header promised its data.
		for n < x[1] {
			k := min(int64(len(t.buf)), x[1]-n)
			clear(t.buf[:k])
			m, err := t.tw.Write(t.buf[:k])
			if err != nil {
				return err
			}
			n += int64(m)
		}
	}
	return nil
}

// holesOf finds the data of a file that has holes; holes is false for one
// sent whole. A file that takes less room on its disk than its size
// (st_blocks) has holes, which SEEK_DATA finds; where they are not found so
// (a file system that takes holes for data) or with readHoles (neither
// says anything: inside gVisor) and a probe finds zeros, the file's blocks
// of zeros are found by reading it (until ctx is done), and are not sent.
func holesOf(ctx context.Context, f *os.File, fi fs.FileInfo, buf []byte, readHoles bool) (ext sparse.Extents, holes bool, err error) {
	size := fi.Size()
	alloc := size // not known: as a file without holes
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		alloc = st.Blocks * 512
	}
	switch {
	case readHoles && size >= minReadHoles:
		if worth, err := sparse.Probe(f, size, holeProbes); err != nil || !worth {
			return nil, false, err
		}
		ext = sparse.Extents{{0, size}}
	case alloc < size:
		if ext, err = sparse.Find(f, size); err != nil {
			ext = sparse.Extents{{0, size}} // no SEEK_DATA here
		}
		if ext.Bytes() <= alloc {
			return ext, true, nil
		}
	default:
		return nil, false, nil
	}
	if ext, err = sparse.Scan(ctx, f, ext, buf); err != nil {
		return nil, false, err
	}
	return ext, len(ext) != 1 || ext[0] != [2]int64{0, size}, nil
}

// minReadHoles is the least size of a file whose holes are found by
// reading it: reading a small file twice costs more than its zeros.
const minReadHoles = 1 << 20

// holeProbes is how many blocks of a file are read to tell whether it is
// worth reading all of it to find its holes (sparse.Probe).
const holeProbes = 64
