package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh." // aufs bookkeeping (.wh..wh.plnk, .wh..wh.aufs): not content
	opaqueWhiteout = ".wh..wh..opq"
	opaqueXattr    = "trusted.overlay.opaque"
	overlayXattrs  = "trusted.overlay."
)

// errUnsafePath marks a tar entry that would land outside the layer.
var errUnsafePath = errors.New("path escapes the layer directory")

// layerContent is what unpackLayer made of a layer.
type layerContent struct {
	size    int64    // bytes of file content written
	devices []Device // device nodes recorded instead of created, by path
}

// maxLayerDevices bounds the device nodes one layer may record (a real
// /dev holds a few dozen); more are not recorded, only hidden.
const maxLayerDevices = 1024

// unpackLayer extracts the uncompressed layer tar r into dir, an existing
// empty directory.
//
// The result is an overlayfs lower layer, so OCI whiteouts are converted
// to what overlayfs understands: ".wh.NAME" becomes a 0/0 character device
// NAME, and ".wh..wh..opq" sets trusted.overlay.opaque=y on its directory.
//
// Device nodes are never created on the host: a layer dir is a host
// directory, and a device node in it would be a door to that device for
// whoever reaches it. A character or block device entry is recorded
// instead (returned in devices, for the runtime to create inside the
// sandbox, see Image.Devices) and nothing is left at its path. (Not a
// whiteout: overlayfs lists a whiteout in a directory no lower layer has
// as an entry that cannot be looked up. What a lower layer has at a
// device's path therefore shows through, and under /dev, where sandboxes
// get the devices, the runtime's tmpfs covers it.) A 0/0 character device
// is an overlayfs whiteout already and is kept as one. FIFOs are created:
// making one needs no privilege and opening one reaches no device.
//
// A layer is untrusted input. Entry names with ".." that climb out are
// rejected, absolute names are taken relative to dir (as docker does), and
// every path is resolved with openat2(RESOLVE_IN_ROOT) from dir, so a
// symlink in the layer — even an absolute one — cannot lead a later entry
// outside it. The final component is never followed.
//
// Files are bounded by b (the layer's content counts against it as it is
// written; nil: no bound), and written with holes where the layer has
// whole blocks of zeros, so that a sparse entry takes only its data's room
// on disk. The loop stops when ctx ends. layer names the layer in b's
// messages.
func unpackLayer(ctx context.Context, r io.Reader, dir string, b *budget, layer string, warn func(msg string, args ...any)) (layerContent, error) {
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return layerContent{}, &hostErr{fmt.Errorf("open the directory to unpack into: %w", err)} // no host path: users see this
	}
	defer unix.Close(root)
	x := &extractor{ctx: ctx, root: root, rootPath: dir, warn: warn, devices: map[string]Device{}, budget: b, layer: layer}
	x.rootReal, _ = os.Readlink(fdPath(root))
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return layerContent{}, err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return layerContent{}, fmt.Errorf("read layer: %w", err)
		}
		if err := x.entry(hdr, tr); err != nil {
			return layerContent{}, fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	}
	// Directory times go last: creating entries in a dir changes its mtime.
	for _, d := range x.dirs {
		x.dirTimes(d.rel, &tar.Header{AccessTime: d.atime, ModTime: d.mtime})
	}
	out := layerContent{size: x.size}
	for _, d := range x.devices {
		out.devices = append(out.devices, d)
	}
	sortDevices(out.devices)
	return out, nil
}

type extractor struct {
	ctx      context.Context
	budget   *budget
	layer    string
	buf      []byte // copy buffer, made on first use
	root     int    // O_RDONLY fd of the layer dir; all resolution starts here
	rootPath string
	rootReal string // the root's path as /proc/self/fd tells it
	warn     func(msg string, args ...any)
	size     int64
	dirs     []dirEntry
	devices  map[string]Device // by resolved rel path (see where)
	tooMany  bool              // maxLayerDevices was reached (warned once)
	manyDirs bool              // maxDirTimes was reached (warned once)
}

// maxDirTimes bounds the directories whose times are set after their
// content (each is kept in memory until the end of the layer); the times
// of any more are left as unpacking made them.
const maxDirTimes = 1 << 20

func (x *extractor) keepDir(rel string, hdr *tar.Header) {
	if len(x.dirs) >= maxDirTimes {
		if !x.manyDirs {
			x.manyDirs = true
			x.warn("layer holds too many directories: the times of the rest are not kept", "max", maxDirTimes, "path", hdr.Name)
		}
		return
	}
	x.dirs = append(x.dirs, dirEntry{rel, hdr.AccessTime, hdr.ModTime})
}

type dirEntry struct {
	rel          string
	atime, mtime time.Time
}

// cleanPath makes a tar name relative to the layer root, rejecting names
// that climb out of it.
func cleanPath(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", errUnsafePath
	}
	p := path.Clean(strings.TrimLeft(name, "/"))
	if p == ".." || strings.HasPrefix(p, "../") {
		return "", errUnsafePath
	}
	return p, nil
}

func splitRel(rel string) (dir, base string) {
	dir, base = path.Split(rel)
	if dir = strings.TrimSuffix(dir, "/"); dir == "" {
		dir = "."
	}
	return dir, base
}

func (x *extractor) entry(hdr *tar.Header, r io.Reader) error {
	rel, err := cleanPath(hdr.Name)
	if err != nil {
		return err
	}
	if rel == "." {
		if hdr.Typeflag != tar.TypeDir {
			return nil
		}
		x.keepDir(rel, hdr)
		return x.meta(x.root, hdr)
	}
	dir, base := splitRel(rel)
	pfd, err := x.openDir(dir, true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	// Devices are kept by the path they really have in the layer: dir may
	// pass through symlinks the layer made.
	rdir := x.where(pfd, dir)
	rrel := path.Join(rdir, base)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return x.whiteout(pfd, rdir, base)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		delete(x.devices, rrel) // a device here is replaced; what is under a dir stays
		return x.mkdir(pfd, rel, base, hdr)
	case tar.TypeReg, tar.TypeGNUSparse: // the reader expands sparse files: copyHoles makes them sparse again
		x.forget(rrel)
		return x.file(pfd, base, hdr, r)
	case tar.TypeSymlink:
		x.forget(rrel)
		if err := removeAt(pfd, base); err != nil {
			return err
		}
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return err
		}
		return x.metaAt(pfd, base, hdr, false)
	case tar.TypeLink:
		return x.link(pfd, rel, rrel, base, hdr)
	case tar.TypeChar, tar.TypeBlock:
		x.forget(rrel)
		if hdr.Typeflag == tar.TypeChar && hdr.Devmajor == 0 && hdr.Devminor == 0 {
			return x.mknod(pfd, base, hdr) // an overlayfs whiteout, as a layer may carry one
		}
		return x.device(pfd, rrel, base, deviceOf(rrel, hdr))
	case tar.TypeFifo:
		x.forget(rrel)
		return x.mknod(pfd, base, hdr)
	case tar.TypeXGlobalHeader:
		return nil
	default:
		x.warn("skipping unsupported layer entry", "path", hdr.Name, "type", string(hdr.Typeflag))
		return nil
	}
}

// whiteout records a deletion in the overlayfs format.
func (x *extractor) whiteout(pfd int, dir, base string) error {
	if base == opaqueWhiteout {
		return unix.Fsetxattr(pfd, opaqueXattr, []byte("y"), 0)
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return nil
	}
	name := strings.TrimPrefix(base, whiteoutPrefix)
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("malformed whiteout %q", base)
	}
	x.forget(path.Join(dir, name))
	if err := removeAt(pfd, name); err != nil {
		return err
	}
	return unix.Mknodat(pfd, name, unix.S_IFCHR, 0)
}

// device records a device node instead of creating it. What an earlier
// entry of the layer put at its path goes.
func (x *extractor) device(pfd int, rel, base string, d Device) error {
	if err := removeAt(pfd, base); err != nil {
		return err
	}
	if len(x.devices) >= maxLayerDevices {
		if !x.tooMany {
			x.tooMany = true
			x.warn("layer holds too many device nodes: the rest are left out", "max", maxLayerDevices, "path", d.Path)
		}
		return nil
	}
	x.devices[rel] = d
	return nil
}

// forget drops the devices recorded at rel and below it: an entry there
// replaces them.
func (x *extractor) forget(rel string) {
	if len(x.devices) == 0 {
		return
	}
	delete(x.devices, rel)
	prefix := rel + "/"
	for p := range x.devices {
		if strings.HasPrefix(p, prefix) {
			delete(x.devices, p)
		}
	}
}

func (x *extractor) mkdir(pfd int, rel, base string, hdr *tar.Header) error {
	err := unix.Mkdirat(pfd, base, 0o700)
	if errors.Is(err, unix.EEXIST) {
		// A dir listed twice merges; anything else in the way is replaced.
		var st unix.Stat_t
		if err = unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if err = removeAt(pfd, base); err == nil {
				err = unix.Mkdirat(pfd, base, 0o700)
			}
		}
	}
	if err != nil {
		return err
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	x.keepDir(rel, hdr)
	return x.meta(fd, hdr)
}

func (x *extractor) file(pfd int, base string, hdr *tar.Header, r io.Reader) error {
	if err := removeAt(pfd, base); err != nil {
		return err
	}
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), base)
	n, err := x.copyHoles(f, r)
	x.size += n
	if err == nil {
		err = x.meta(fd, hdr)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return setTimes(pfd, base, hdr)
}

// holeBlock is the unit copyHoles leaves a hole for: a filesystem block.
const holeBlock = 4 << 10

// copyHoles copies r to the new, empty file f, counting each byte against
// the budget before it is written and leaving a hole wherever r has a
// whole aligned block of zeros (a sparse entry's holes among them: the
// tar reader yields them as zeros). The file reads the same; only the
// room it takes on disk differs. It returns the bytes copied.
func (x *extractor) copyHoles(f *os.File, r io.Reader) (int64, error) {
	if x.buf == nil {
		x.buf = make([]byte, 256<<10)
	}
	var off int64
	for {
		if err := x.ctx.Err(); err != nil {
			return off, err
		}
		n, rerr := readChunk(r, x.buf)
		if n > 0 {
			if err := x.budget.write(int64(n), x.layer); err != nil {
				return off, err
			}
			if err := writeData(f, x.buf[:n], off); err != nil {
				return off, err
			}
			off += int64(n)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return off, rerr
		}
	}
	// The length, for a file that ends in a hole.
	return off, f.Truncate(off)
}

// readChunk reads into buf until it is full or r ends (io.EOF) or fails.
func readChunk(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

var zeroBlock [holeBlock]byte

// writeData writes b at off in f, but for its blocks of zeros (off is a
// multiple of holeBlock: each block of b is aligned in the file).
func writeData(f *os.File, b []byte, off int64) error {
	for i := 0; i < len(b); {
		if end := min(i+holeBlock, len(b)); bytes.Equal(b[i:end], zeroBlock[:end-i]) {
			i = end
			continue
		}
		j := i + holeBlock
		for j < len(b) {
			end := min(j+holeBlock, len(b))
			if bytes.Equal(b[j:end], zeroBlock[:end-j]) {
				break
			}
			j = end
		}
		j = min(j, len(b))
		if _, err := f.WriteAt(b[i:j], off+int64(i)); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// link makes a hard link to an earlier entry of the same layer.
func (x *extractor) link(pfd int, rel, rrel, base string, hdr *tar.Header) error {
	target, err := cleanPath(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
	}
	if target == rel {
		return nil
	}
	if target == "." {
		return fmt.Errorf("hard link to the layer root")
	}
	tdir, tbase := splitRel(target)
	tfd, err := x.openDir(tdir, false)
	if err != nil {
		return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
	}
	defer unix.Close(tfd)
	d, isDev := x.devices[path.Join(x.where(tfd, tdir), tbase)]
	x.forget(rrel)
	if isDev { // a second name of a device node
		d.Path = "/" + rrel
		return x.device(pfd, rrel, base, d)
	}
	if err := removeAt(pfd, base); err != nil {
		return err
	}
	return unix.Linkat(tfd, tbase, pfd, base, 0)
}

// mknod makes a FIFO, or a 0/0 character device (a whiteout): nothing
// that reaches a device.
func (x *extractor) mknod(pfd int, base string, hdr *tar.Header) error {
	mode := uint32(unix.S_IFIFO)
	if hdr.Typeflag == tar.TypeChar {
		mode = unix.S_IFCHR
	}
	if err := removeAt(pfd, base); err != nil {
		return err
	}
	if err := unix.Mknodat(pfd, base, mode|perm(hdr), 0); err != nil {
		return err
	}
	return x.metaAt(pfd, base, hdr, true)
}

// meta applies owner, mode and xattrs through an open fd (files, dirs).
// Owner goes first: chown clears setuid/setgid bits.
func (x *extractor) meta(fd int, hdr *tar.Header) error {
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, perm(hdr)); err != nil {
		return err
	}
	x.xattrs(hdr, func(k string, v []byte) error { return unix.Fsetxattr(fd, k, v, 0) })
	return nil
}

// metaAt applies metadata to an entry that cannot be opened (symlinks,
// devices), without following it.
func (x *extractor) metaAt(pfd int, base string, hdr *tar.Header, chmod bool) error {
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if chmod { // not a symlink: we just created it
		if err := unix.Fchmodat(pfd, base, perm(hdr), 0); err != nil {
			return err
		}
	}
	p := procPath(pfd, base)
	x.xattrs(hdr, func(k string, v []byte) error { return unix.Lsetxattr(p, k, v, 0) })
	return setTimes(pfd, base, hdr)
}

// xattrs applies the extended attributes recorded in PAX headers. Failures
// are logged, not fatal: a filesystem may not support some namespace.
// trusted.overlay.* from the image is dropped: those attributes steer
// overlayfs itself (redirects, metacopy) and only we may set them.
func (x *extractor) xattrs(hdr *tar.Header, set func(k string, v []byte) error) {
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		if strings.HasPrefix(name, overlayXattrs) {
			x.warn("dropping overlayfs xattr from layer", "path", hdr.Name, "xattr", name)
			continue
		}
		if err := set(name, []byte(v)); err != nil {
			x.warn("cannot set xattr", "path", hdr.Name, "xattr", name, "err", err)
		}
	}
}

func (x *extractor) dirTimes(rel string, hdr *tar.Header) {
	if rel == "." {
		if !hdr.ModTime.IsZero() {
			_ = os.Chtimes(x.rootPath, accessTime(hdr), hdr.ModTime)
		}
		return
	}
	dir, base := splitRel(rel)
	pfd, err := x.openDir(dir, false)
	if err != nil {
		return
	}
	defer unix.Close(pfd)
	_ = setTimes(pfd, base, hdr)
}

// openDir opens dir (relative to the root, resolved inside it), creating
// missing parents as root-owned 0755 dirs like docker does.
func (x *extractor) openDir(dir string, create bool) (int, error) {
	fd, err := x.openat2(dir)
	if err == nil || !create || !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	parent := "."
	for _, c := range strings.Split(dir, "/") {
		pfd, err := x.openat2(parent)
		if err != nil {
			return -1, err
		}
		err = unix.Mkdirat(pfd, c, 0o755)
		if err == nil {
			err = unix.Fchmodat(pfd, c, 0o755, 0) // undo the umask
		} else if errors.Is(err, unix.EEXIST) {
			err = nil
		}
		unix.Close(pfd)
		if err != nil {
			return -1, err
		}
		parent = path.Join(parent, c)
	}
	return x.openat2(dir)
}

func (x *extractor) openat2(rel string) (int, error) {
	how := unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	}
	for {
		fd, err := unix.Openat2(x.root, rel, &how)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		return fd, err
	}
}

// removeAt clears the way for a new entry named name in dirfd.
func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.EISDIR):
		return pathErr(os.RemoveAll(procPath(dirfd, name))) // the /proc path means nothing to a user
	}
	return err
}

// procPath names an entry of an open dir for path-only syscalls; the
// /proc/self/fd link pins the already-resolved dir.
func procPath(dirfd int, name string) string {
	return fdPath(dirfd) + "/" + name
}

func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// where names the dir open as fd relative to the layer root, symlinks
// resolved ("." for the root itself), or returns lexical if it cannot tell.
func (x *extractor) where(fd int, lexical string) string {
	p, err := os.Readlink(fdPath(fd))
	switch {
	case err != nil || x.rootReal == "":
		return lexical
	case p == x.rootReal:
		return "."
	}
	if rel, ok := strings.CutPrefix(p, x.rootReal+"/"); ok {
		return rel
	}
	return lexical
}

func perm(hdr *tar.Header) uint32 { return uint32(hdr.Mode) & 0o7777 }

func accessTime(hdr *tar.Header) time.Time {
	if hdr.AccessTime.IsZero() {
		return hdr.ModTime
	}
	return hdr.AccessTime
}

func setTimes(dirfd int, base string, hdr *tar.Header) error {
	if hdr.ModTime.IsZero() {
		return nil
	}
	at, err1 := unix.TimeToTimespec(accessTime(hdr))
	mt, err2 := unix.TimeToTimespec(hdr.ModTime)
	if err1 != nil || err2 != nil {
		return nil // out of range for this platform: keep the current time
	}
	return unix.UtimesNanoAt(dirfd, base, []unix.Timespec{at, mt}, unix.AT_SYMLINK_NOFOLLOW)
}
