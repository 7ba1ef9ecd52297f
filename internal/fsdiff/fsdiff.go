// Package fsdiff compares the files of two sandboxes of one lineage from
// their own layers: each sandbox's overlay upper directory holds all it
// changed over the image they share, so only what is in either upper is
// looked at (and, for a path one of them changed, the image's own entry),
// never a walk of the image. An upper's whiteouts (a character device 0/0)
// are removals, and an opaque directory (trusted.overlay.opaque=y) hides
// the image's entries below it, as overlayfs has them.
//
// The directories it reads are private read-only copies (see
// rootfs.View): nothing changes under the walk. Still, no symlink is
// followed and no special file opened. What a diff reads of files' data
// is bounded (Options.MaxRead), and it ends when its context does: a
// sandbox controls the files, and a file of terabytes of holes costs it
// nothing to make.
package fsdiff

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/aymanbagabas/go-udiff"
	"golang.org/x/sys/unix"
)

// Change is one path that differs.
type Change struct {
	Path  string   `json:"path"`
	Kind  string   `json:"kind"`           // added, removed, changed
	Type  string   `json:"type"`           // file, dir, symlink, ...: what is there in B (in A for a removal)
	What  []string `json:"what,omitempty"` // changed: content, type, mode, owner, target
	SizeA int64    `json:"size_a"`         // a file's size in A (0 if none)
	SizeB int64    `json:"size_b"`
	Patch string   `json:"patch,omitempty"` // unified diff of a text file (Options.Patch)
	// NotCompared is what the diff could not tell (content: the diff's
	// read bound, Options.MaxRead, came first): the file may differ there
	// or not. A change with nothing in What but this is listed all the
	// same, since it may be one.
	NotCompared []string `json:"not_compared,omitempty"`
	// PathBytes is Path's bytes when they are not UTF-8, which JSON
	// cannot carry in a string (Path has U+FFFD for each bad byte there).
	PathBytes []byte `json:"path_bytes,omitempty"`
}

// Kinds of Change.
const (
	Added   = "added"
	Removed = "removed"
	Changed = "changed"
)

// Result is a diff from A to B.
type Result struct {
	Changes []Change `json:"changes"`
	Added   int      `json:"added"`
	Removed int      `json:"removed"`
	Changed int      `json:"changed"`
	// Truncated: not every change is listed: more than Options.MaxChanges
	// (only the first are), more than Options.MaxEntries directory entries
	// (the walk stopped there), or a path the host cannot look up (longer
	// than PATH_MAX with the directory of its side: left out).
	Truncated bool `json:"truncated"`
	// NotCompared counts the changes (of Changed) whose content was not
	// compared: the diff's read bound came first.
	NotCompared int `json:"not_compared"`
}

// NotComparedWhy says why a change's NotCompared holds content.
const NotComparedWhy = "past the diff's read bound"

// Options bound a diff.
type Options struct {
	// Skip are paths (absolute) left out, each by itself and while it is
	// of the type the server puts there: what is below
	// a directory named here is compared still. They are what the server
	// itself puts in every sandbox; a file of the sandbox's own beside
	// them must show.
	Skip []Skip
	// Written are files the server writes in every sandbox, whose changes
	// are left out only while each side holds what the server wrote.
	Written    []Written
	Patch      bool  // text diffs of changed text files
	MaxChanges int   // 0: DefaultMaxChanges
	MaxPatch   int64 // a file larger than this gets no text diff (0: DefaultMaxPatch)
	// MaxRead bounds the bytes of files' data the diff reads, both sides'
	// comparisons and patches together (0: DefaultMaxRead). Holes are not
	// read. Past it a file whose content is not yet told apart is listed
	// with NotCompared content.
	MaxRead int64
	// MaxEntries bounds the directory entries the diff reads, both sides'
	// and the image's together (0: DefaultMaxEntries): each costs the
	// server memory while its directory is compared, and a sandbox makes
	// millions of them in a few MiB (hard links to one file). Past it the
	// diff stops, Truncated.
	MaxEntries int
}

// Skip is a path the server itself puts in every sandbox, and its type
// there (dir, file): a change of it is left out while it is of that type
// on each side, but something else a sandbox put in its place (a file of
// its own data where the server has a directory) is listed.
type Skip struct {
	Path string
	Type string
	// IfAdded: the server makes it only where the image has none (the
	// directory above one of its own paths): it is left out as added,
	// and a change of the image's own is listed.
	IfAdded bool
}

// skipped reports whether c is of a path in o.Skip, of its type.
func (o *Options) skipped(c Change) bool {
	return slices.ContainsFunc(o.Skip, func(s Skip) bool {
		return s.Path == c.Path && s.Type == c.Type && !slices.Contains(c.What, "type") && (!s.IfAdded || c.Kind == Added)
	})
}

// Written is a file the server itself writes in a sandbox (the fork
// contract's): a change to it is left out while A and B each say their
// side's file is what the server wrote, and listed otherwise.
type Written struct {
	Path string
	// A and B are given a side's file (at most maxWritten bytes; a
	// larger one is never the server's), present false where the side
	// has none, and say whether it is as the server left it; nil takes
	// whatever the side holds (an image's own).
	A, B func(data []byte, present bool) bool
}

// Defaults of Options.
const (
	DefaultMaxChanges = 20000
	DefaultMaxPatch   = 1 << 20
	DefaultMaxRead    = 1 << 30
	DefaultMaxEntries = 1 << 20
	maxPatchTotal     = 16 << 20
	maxWritten        = 64 << 10
)

// Tree is one side: an overlay upper directory over the image's layers.
type Tree struct {
	Upper string
}

// Diff compares a and b, two uppers over the same lower layers (bottom
// first), and lists what changed from a to b in path order. It ends with
// ctx's error when ctx ends.
func Diff(ctx context.Context, a, b Tree, lowers []string, o Options) (*Result, error) {
	if o.MaxChanges <= 0 {
		o.MaxChanges = DefaultMaxChanges
	}
	if o.MaxPatch <= 0 {
		o.MaxPatch = DefaultMaxPatch
	}
	if o.MaxRead <= 0 {
		o.MaxRead = DefaultMaxRead
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	d := &differ{ctx: ctx, a: a.Upper, b: b.Upper, lowers: lowers, o: o, res: &Result{Changes: []Change{}}, chains: map[layerDir]chain{}}
	for _, root := range append([]string{a.Upper, b.Upper}, lowers...) {
		d.rootLen = max(d.rootLen, len(root))
	}
	if err := d.dir("", false, false); err != nil && !errors.Is(err, errFull) {
		return nil, err
	}
	return d.res, nil
}

var errFull = errors.New("diff: too many changes")

type differ struct {
	ctx        context.Context
	a, b       string
	lowers     []string
	o          Options
	res        *Result
	patchBytes int64
	read       int64              // bytes of files' data read so far (Options.MaxRead)
	entries    int                // directory entries read so far (Options.MaxEntries)
	rootLen    int                // the longest of the directories the sides' paths are under
	bufA, bufB []byte             // sameRange's, made at its first call
	chains     map[layerDir]chain // a directory's standing in a layer (chain)
}

// entry is what one side has at a path.
type entry struct {
	fi    fs.FileInfo
	path  string // on the host, for reading
	where string // "upper" or "lower"
}

func (e *entry) typ() string {
	if e == nil {
		return ""
	}
	switch m := e.fi.Mode(); {
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m&fs.ModeNamedPipe != 0:
		return "fifo"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeCharDevice != 0:
		return "char"
	case m&fs.ModeDevice != 0:
		return "block"
	}
	return "file"
}

func (e *entry) size() int64 {
	if e == nil || !e.fi.Mode().IsRegular() {
		return 0
	}
	return e.fi.Size()
}

func isWhiteout(fi fs.FileInfo) bool {
	if fi.Mode()&fs.ModeCharDevice == 0 {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Rdev == 0
}

func opaque(p string) bool {
	buf := make([]byte, 4)
	n, err := unix.Lgetxattr(p, "trusted.overlay.opaque", buf)
	return err == nil && n == 1 && buf[0] == 'y'
}

// names lists dir's entries (none if it is not a directory), counted
// against the diff's bound of entries read: past it, errFull, with no more
// than a batch past the bound read.
func (d *differ) names(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, nil
	}
	defer f.Close()
	var out []string
	for {
		if err := d.ctx.Err(); err != nil {
			return nil, err
		}
		ns, err := f.Readdirnames(1024)
		if d.entries += len(ns); d.entries > d.o.MaxEntries {
			d.res.Truncated = true
			return nil, errFull
		}
		out = append(out, ns...)
		if err != nil { // io.EOF, or a directory read no further
			return out, nil
		}
	}
}

// reachable reports whether the host can look rel up on every side: a
// sandbox reaches a path of any length (by relative ones), but one longer
// than PATH_MAX with the directory of its side is not found there, and
// would be taken for absent. Such a path is left out, and the diff says
// it is not complete (Truncated).
func (d *differ) reachable(rel string) bool {
	if d.rootLen+1+len(rel) < unix.PathMax {
		return true
	}
	d.res.Truncated = true
	return false
}

// chain says how directory rel (a path in the image, "" its root) stands
// in one layer: present, every component a real directory there; hides,
// a component is an opaque directory, a whiteout or anything but a
// directory, which hides what the layers below hold under it (overlayfs
// merges a directory's layers only while each has it as a directory, and
// never follows a symlink of a layer). Only a present chain is ever
// looked into: a layer's symlink (an image's "/data -> /etc") must never
// lead a walk to the host's files.
type chain struct{ present, hides bool }

func (d *differ) chain(layer int, rel string) chain {
	if rel == "" || rel == "." {
		return chain{present: true}
	}
	k := layerDir{layer, rel}
	if c, ok := d.chains[k]; ok {
		return c
	}
	parent := d.chain(layer, parentOf(rel))
	c := chain{hides: parent.hides}
	if parent.present {
		p := filepath.Join(d.lowers[layer], rel)
		fi, err := os.Lstat(p)
		switch {
		case err != nil:
		case fi.IsDir():
			c.present = true
			c.hides = c.hides || opaque(p)
		default:
			c.hides = true
		}
	}
	d.chains[k] = c
	return c
}

type layerDir struct {
	layer int
	rel   string
}

func parentOf(rel string) string {
	if p := path.Dir(rel); p != "." {
		return p
	}
	return ""
}

// lower finds rel in the image's layers, top first: nil if no layer has it,
// a whiteout hides it, or something above it in a layer (an opaque
// directory, a whiteout, a file or a symlink) hides what the layers below
// hold.
func (d *differ) lower(rel string) *entry {
	dir := parentOf(rel)
	for i := len(d.lowers) - 1; i >= 0; i-- {
		c := d.chain(i, dir)
		if c.present {
			p := filepath.Join(d.lowers[i], rel)
			if fi, err := os.Lstat(p); err == nil {
				if isWhiteout(fi) {
					return nil
				}
				return &entry{fi: fi, path: p, where: "lower"}
			}
		}
		if c.hides {
			return nil
		}
	}
	return nil
}

// lowerNames lists what the image's layers hold in directory rel, as
// overlayfs merges them: top first, down to a layer that hides the rest.
func (d *differ) lowerNames(rel string) ([]string, error) {
	var out []string
	for i := len(d.lowers) - 1; i >= 0; i-- {
		c := d.chain(i, rel)
		if c.present {
			ns, err := d.names(filepath.Join(d.lowers[i], rel))
			if err != nil {
				return nil, err
			}
			out = append(out, ns...)
		}
		if c.hides {
			break
		}
	}
	return out, nil
}

// side is what one side has at rel: its upper's entry, a whiteout's
// absence, or (where its upper says nothing and no opaque directory above
// hides the image) the image's.
func (d *differ) side(upper, rel string, hidden bool) (e *entry, inUpper bool) {
	p := filepath.Join(upper, rel)
	fi, err := os.Lstat(p)
	if err == nil {
		if isWhiteout(fi) {
			return nil, true
		}
		return &entry{fi: fi, path: p, where: "upper"}, true
	}
	if hidden {
		return nil, false
	}
	return d.lower(rel), false
}

// dir compares directory rel (which both sides have as a directory, or
// one side has in its upper), given whether each side's image content
// is hidden at it (an opaque directory at or above it).
func (d *differ) dir(rel string, hiddenA, hiddenB bool) error {
	aDir, bDir := filepath.Join(d.a, rel), filepath.Join(d.b, rel)
	if rel != "" {
		hiddenA = hiddenA || opaque(aDir)
		hiddenB = hiddenB || opaque(bDir)
	}
	var lists [][]string
	for _, dir := range []string{aDir, bDir} {
		ns, err := d.names(dir)
		if err != nil {
			return err
		}
		lists = append(lists, ns)
	}
	if hiddenA != hiddenB {
		// One side sees the image's entries here and the other does not:
		// those differ too.
		ns, err := d.lowerNames(rel)
		if err != nil {
			return err
		}
		lists = append(lists, ns)
	}
	set := map[string]bool{}
	for _, ns := range lists {
		for _, n := range ns {
			set[n] = true
		}
	}
	all := make([]string, 0, len(set))
	for n := range set {
		all = append(all, n)
	}
	slices.Sort(all)
	for _, n := range all {
		if err := d.path(path.Join(rel, n), hiddenA, hiddenB); err != nil {
			return err
		}
	}
	return nil
}

func (d *differ) path(rel string, hiddenA, hiddenB bool) error {
	if err := d.ctx.Err(); err != nil {
		return err
	}
	if !d.reachable(rel) {
		return nil
	}
	ea, inA := d.side(d.a, rel, hiddenA)
	eb, inB := d.side(d.b, rel, hiddenB)
	if !inA && !inB && hiddenA == hiddenB {
		return nil // both see the image's
	}
	switch {
	case ea == nil && eb == nil:
		return nil
	case ea == nil:
		if err := d.add(Change{Path: "/" + rel, Kind: Added, Type: eb.typ(), SizeB: eb.size()}, nil, eb); err != nil {
			return err
		}
		if eb.typ() == "dir" {
			return d.listAll(rel, eb, Added, hiddenB, func(r string) *entry { e, _ := d.side(d.b, r, hiddenB || opaque(eb.path)); return e })
		}
		return nil
	case eb == nil:
		if err := d.add(Change{Path: "/" + rel, Kind: Removed, Type: ea.typ(), SizeA: ea.size()}, ea, nil); err != nil {
			return err
		}
		if ea.typ() == "dir" {
			return d.listAll(rel, ea, Removed, hiddenA, func(r string) *entry { e, _ := d.side(d.a, r, hiddenA || opaque(ea.path)); return e })
		}
		return nil
	}
	what, unknown, err := d.compare(ea, eb)
	if err != nil {
		return err
	}
	if len(what) > 0 || len(unknown) > 0 {
		c := Change{Path: "/" + rel, Kind: Changed, Type: eb.typ(), What: what, NotCompared: unknown, SizeA: ea.size(), SizeB: eb.size()}
		if err := d.add(c, ea, eb); err != nil {
			return err
		}
	}
	if ea.typ() == "dir" && eb.typ() == "dir" && (inA || inB) {
		return d.dir(rel, hiddenA, hiddenB)
	}
	return nil
}

// listAll lists what is below a directory only one side has (added or
// removed with it).
func (d *differ) listAll(rel string, e *entry, kind string, hidden bool, side func(string) *entry) error {
	ns, err := d.names(e.path)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, n := range ns {
		seen[n] = true
	}
	if !hidden && !opaque(e.path) {
		lns, err := d.lowerNames(rel)
		if err != nil {
			return err
		}
		for _, n := range lns {
			if !seen[n] {
				seen[n] = true
				ns = append(ns, n)
			}
		}
	}
	slices.Sort(ns)
	for _, n := range ns {
		if err := d.ctx.Err(); err != nil {
			return err
		}
		r := path.Join(rel, n)
		if !d.reachable(r) {
			continue
		}
		c := side(r)
		if c == nil {
			continue
		}
		ch := Change{Path: "/" + r, Kind: kind, Type: c.typ()}
		var a, b *entry
		if kind == Added {
			ch.SizeB, b = c.size(), c
		} else {
			ch.SizeA, a = c.size(), c
		}
		if err := d.add(ch, a, b); err != nil {
			return err
		}
		if c.typ() == "dir" {
			if err := d.listAll(r, c, kind, hidden, side); err != nil {
				return err
			}
		}
	}
	return nil
}

func (d *differ) add(c Change, a, b *entry) error {
	if d.o.skipped(c) || d.asWritten(c, a, b) {
		return nil
	}
	if len(d.res.Changes) >= d.o.MaxChanges {
		d.res.Truncated = true
		return errFull
	}
	switch c.Kind {
	case Added:
		d.res.Added++
	case Removed:
		d.res.Removed++
	case Changed:
		d.res.Changed++
	}
	if len(c.NotCompared) > 0 {
		d.res.NotCompared++
	}
	if !utf8.ValidString(c.Path) {
		c.PathBytes = []byte(c.Path)
	}
	if d.o.Patch && c.Type == "file" && (a == nil || a.typ() == "file") && (b == nil || b.typ() == "file") {
		p, err := d.patch(c, a, b)
		if err != nil {
			return err
		}
		c.Patch = p
	}
	d.res.Changes = append(d.res.Changes, c)
	return nil
}

// asWritten reports whether c is a change of a file the server writes
// (Options.Written) that each side holds as the server wrote it, its mode
// and owner alike on both.
func (d *differ) asWritten(c Change, a, b *entry) bool {
	i := slices.IndexFunc(d.o.Written, func(w Written) bool { return w.Path == c.Path })
	if i < 0 || slices.ContainsFunc(c.What, func(w string) bool { return w != "content" }) {
		return false
	}
	w := d.o.Written[i]
	return written(a, w.A) && written(b, w.B)
}

// written reports whether e, one side's entry of a Written file, is as
// the server left it (as; nil: whatever it is).
func written(e *entry, as func(data []byte, present bool) bool) bool {
	if as == nil {
		return true
	}
	if e == nil {
		return as(nil, false)
	}
	if e.typ() != "file" || e.size() > maxWritten {
		return false
	}
	f, err := os.OpenFile(e.path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxWritten+1))
	return err == nil && len(data) <= maxWritten && as(data, true)
}

// compare says how two entries at one path differ (nothing: the same),
// and what it could not tell (content, past the diff's read bound).
func (d *differ) compare(a, b *entry) (what, unknown []string, err error) {
	if a.typ() != b.typ() {
		return []string{"type"}, nil, nil
	}
	sa, _ := a.fi.Sys().(*syscall.Stat_t)
	sb, _ := b.fi.Sys().(*syscall.Stat_t)
	switch a.typ() {
	case "file":
		same, err := d.sameContent(a, b, sa, sb)
		switch {
		case errors.Is(err, errPastBound):
			unknown = []string{"content"}
		case err != nil:
			return nil, nil, err
		case !same:
			what = append(what, "content")
		}
	case "symlink":
		la, _ := os.Readlink(a.path)
		lb, _ := os.Readlink(b.path)
		if la != lb {
			what = append(what, "target")
		}
	case "char", "block":
		if sa != nil && sb != nil && sa.Rdev != sb.Rdev {
			what = append(what, "device")
		}
	}
	if a.typ() != "symlink" && a.fi.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != b.fi.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) {
		what = append(what, "mode")
	}
	if sa != nil && sb != nil && (sa.Uid != sb.Uid || sa.Gid != sb.Gid) {
		what = append(what, "owner")
	}
	return what, unknown, nil
}

// errPastBound: the diff's read bound (Options.MaxRead) came before an
// answer.
var errPastBound = errors.New("fsdiff: " + NotComparedWhy)

// readChunk is how much of a file one read takes.
const readChunk = 256 << 10

// sameContent compares two files' bytes. Two uppers of one lineage are
// block copies of one filesystem: a file neither changed since they parted
// has the same inode number, size and change time in both, which no write
// keeps (a write sets the change time), so its bytes need no reading.
//
// Otherwise only data is read, by the files' data maps (SEEK_DATA,
// SEEK_HOLE): where both have a hole both read as zeros; where one has a
// hole the other's data there must be zeros, since a file of written
// zeros holds what one of holes does. It ends with ctx's error, or with
// errPastBound at the diff's read bound unless a difference came first.
func (d *differ) sameContent(a, b *entry, sa, sb *syscall.Stat_t) (bool, error) {
	size := a.fi.Size()
	if size != b.fi.Size() {
		return false, nil
	}
	if a.where == "upper" && b.where == "upper" && sa != nil && sb != nil &&
		sa.Ino == sb.Ino && sa.Ctim == sb.Ctim && sa.Mtim == sb.Mtim {
		return true, nil
	}
	fa, err := os.OpenFile(a.path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return false, nil
	}
	defer fa.Close()
	fb, err := os.OpenFile(b.path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return false, nil
	}
	defer fb.Close()
	for off := int64(0); off < size; {
		if err := d.ctx.Err(); err != nil {
			return false, err
		}
		endA, dataA := extent(fa, off, size)
		endB, dataB := extent(fb, off, size)
		end := min(endA, endB)
		if dataA || dataB {
			ra, rb := fa, fb
			if !dataA {
				ra = nil
			}
			if !dataB {
				rb = nil
			}
			if same, err := d.sameRange(ra, rb, off, end); err != nil || !same {
				return false, err
			}
		}
		off = end
	}
	return true, nil
}

// extent says whether offset off of f (of size bytes, off below it) is in
// data or in a hole, and where that run ends. A filesystem that cannot
// tell has data throughout.
func extent(f *os.File, off, size int64) (end int64, data bool) {
	next, err := f.Seek(off, unix.SEEK_DATA)
	switch {
	case errors.Is(err, syscall.ENXIO):
		return size, false // no data past off
	case err != nil:
		return size, true
	case next > off:
		return min(next, size), false
	}
	h, err := f.Seek(off, unix.SEEK_HOLE)
	if err != nil || h <= off {
		return size, true
	}
	return min(h, size), true
}

// sameRange compares bytes [off, end) of fa and fb, a nil file being a
// hole there (zeros), each byte read counted against the read bound. A
// file that cannot be read differs.
func (d *differ) sameRange(fa, fb *os.File, off, end int64) (bool, error) {
	if d.bufA == nil {
		d.bufA, d.bufB = make([]byte, readChunk), make([]byte, readChunk)
	}
	for off < end {
		if err := d.ctx.Err(); err != nil {
			return false, err
		}
		n := min(int64(readChunk), end-off)
		if err := d.charge(n, fa, fb); err != nil {
			return false, err
		}
		ba, bb := d.bufA[:n], d.bufB[:n]
		if !readAt(fa, ba, off) || !readAt(fb, bb, off) || !bytes.Equal(ba, bb) {
			return false, nil
		}
		off += n
	}
	return true, nil
}

// charge counts n bytes read from each of files that is not nil against
// the read bound, or says it is past it.
func (d *differ) charge(n int64, files ...*os.File) error {
	var cost int64
	for _, f := range files {
		if f != nil {
			cost += n
		}
	}
	if d.read+cost > d.o.MaxRead {
		return errPastBound
	}
	d.read += cost
	return nil
}

// readAt fills buf from f at off (zeros for a nil f).
func readAt(f *os.File, buf []byte, off int64) bool {
	if f == nil {
		clear(buf)
		return true
	}
	_, err := f.ReadAt(buf, off)
	return err == nil
}

// hasHole reports whether f (size bytes) has a hole before its end,
// which reads as NUL bytes.
func hasHole(f *os.File, size int64) bool {
	h, err := f.Seek(0, unix.SEEK_HOLE)
	return err == nil && h < size
}

// patch is a unified diff of a text file's two versions, or a line saying
// why there is none: a file that is binary or too big, the patches' total
// or the diff's read bound reached.
func (d *differ) patch(c Change, a, b *entry) (string, error) {
	if len(c.NotCompared) > 0 {
		return "(diff left out: content not compared, " + NotComparedWhy + ")\n", nil
	}
	read := func(e *entry) (string, bool, error) {
		if e == nil {
			return "", true, nil
		}
		if e.fi.Size() > d.o.MaxPatch {
			return "", false, nil
		}
		f, err := os.OpenFile(e.path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
		if err != nil {
			return "", false, nil
		}
		defer f.Close()
		if hasHole(f, e.fi.Size()) {
			return "", false, nil // NULs: binary, known without a read
		}
		if err := d.ctx.Err(); err != nil {
			return "", false, err
		}
		if err := d.charge(e.fi.Size(), f); err != nil {
			return "", false, err
		}
		buf, err := io.ReadAll(io.NewSectionReader(f, 0, d.o.MaxPatch+1)) // from 0: hasHole moved the offset
		if err != nil || int64(len(buf)) > d.o.MaxPatch || bytes.IndexByte(buf, 0) >= 0 || !utf8.Valid(buf) {
			return "", false, nil
		}
		return string(buf), true, nil
	}
	ta, okA, err := read(a)
	var tb string
	okB := false
	if err == nil {
		tb, okB, err = read(b)
	}
	switch {
	case errors.Is(err, errPastBound):
		return "(diff left out: " + NotComparedWhy + ")\n", nil
	case err != nil:
		return "", err
	}
	p := c.Path
	from, to := "a"+p, "b"+p
	if a == nil {
		from = "/dev/null"
	}
	if b == nil {
		to = "/dev/null"
	}
	if !okA || !okB {
		return "Binary files " + quoteName(from) + " and " + quoteName(to) + " differ\n", nil
	}
	out := udiff.Unified(headerName(from), headerName(to), ta, tb)
	if d.patchBytes+int64(len(out)) > maxPatchTotal {
		return "(diff left out: the diff's patches are past " + strconv.Itoa(maxPatchTotal>>20) + " MiB)\n", nil
	}
	d.patchBytes += int64(len(out))
	return out, nil
}

// headerName is a file's name on a patch's ---/+++ line, as git writes it:
// quoted (quoteName) if it must be, else followed by a tab if it has a
// space, since GNU patch reads an unquoted name up to a tab, or up to the
// first space when the line has no tab, and would patch "a/my" for
// "a/my file". git apply reads both forms.
func headerName(name string) string {
	if q := quoteName(name); q != name {
		return q
	}
	if strings.ContainsRune(name, ' ') {
		return name + "\t"
	}
	return name
}

// quoteName is name as git quotes a path (quote_c_style, core.quotePath
// on): as it is unless it has a control character, a double quote, a
// backslash or a byte past ASCII; then in double quotes, C escapes for
// those, octal for the rest. GNU patch (2.7 on) and git apply read it.
func quoteName(name string) string {
	if !strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == '"' || r == '\\' || r >= 0x7f }) {
		return name // (a byte that is not UTF-8 reads as U+FFFD: quoted)
	}
	const special, letter = "\a\b\t\n\v\f\r\"\\", "abtnvfr\"\\"
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch k := strings.IndexByte(special, c); {
		case k >= 0:
			b.WriteByte('\\')
			b.WriteByte(letter[k])
		case c < 0x20 || c >= 0x7f:
			fmt.Fprintf(&b, "\\%03o", c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
