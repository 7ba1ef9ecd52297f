// Package sparse moves sparse files as their data: a file whose holes
// (never written, never stored) are most of it is sent as its size and
// its data extents, and written back with the same holes. A checkpoint's
// files between nodes and a sandbox's files in and out (shard cp) go so,
// as tar entries that carry two PAX records of shard's (Header, FromHeader).
package sparse

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/useshards/shard/client"
)

// Extents are a sparse file's data regions, [offset, length] each, in order.
type Extents [][2]int64

// Bytes is the data the extents hold.
func (e Extents) Bytes() int64 {
	var n int64
	for _, x := range e {
		n += x[1]
	}
	return n
}

// String is the extents as "off:len,off:len" (for a tar record).
func (e Extents) String() string {
	parts := make([]string, len(e))
	for i, x := range e {
		parts[i] = strconv.FormatInt(x[0], 10) + ":" + strconv.FormatInt(x[1], 10)
	}
	return strings.Join(parts, ",")
}

// Parse reads what String wrote, checking that the extents are in order,
// do not overlap, end within size and are whole blocks: each starts on a
// block and is a number of them long, but one that ends at size. What a
// receiver writes is then the data it is sent (rounded up to a block, the
// file's last): extents of a byte a block apart would each take a block
// of its disk, 4096 times the data.
func Parse(s string, size int64) (Extents, error) {
	var out Extents
	end := int64(0)
	for _, p := range strings.Split(s, ",") {
		if p == "" {
			continue
		}
		a, b, ok := strings.Cut(p, ":")
		off, err1 := strconv.ParseInt(a, 10, 64)
		n, err2 := strconv.ParseInt(b, 10, 64)
		if !ok || err1 != nil || err2 != nil || off < end || n <= 0 || off+n > size || off+n < off {
			return nil, fmt.Errorf("bad extent %q", p)
		}
		if off%Block != 0 || (n%Block != 0 && off+n != size) {
			return nil, fmt.Errorf("extent %q is not whole blocks of %d bytes", p, Block)
		}
		out = append(out, [2]int64{off, n})
		end = off + n
	}
	return out, nil
}

// MaxExtents bounds the extents Find and Scan give: a tar's PAX records
// are read only up to 1 MiB (Go's archive/tar refuses more), and a file
// cut into more regions than this is sent with its smallest holes as data.
const MaxExtents = 16 << 10

// builder gathers extents in order, whole blocks (Parse) within size,
// merging those closer than minHole, and raises minHole whenever there
// are more than MaxExtents.
type builder struct {
	ext     Extents
	size    int64 // the file's: the last extent may end there, off a block
	minHole int64 // a gap shorter than this is sent as data
}

func (b *builder) add(off, n int64) {
	// Out to whole blocks: a file system of smaller blocks (ext4 of 1 KiB)
	// has its holes there, and the data around them is read as it is.
	end := off + n
	if r := end % Block; r != 0 {
		if b.size-end < Block-r {
			end = b.size
		} else {
			end += Block - r
		}
	}
	off = off / Block * Block
	if k := len(b.ext); k > 0 && off-(b.ext[k-1][0]+b.ext[k-1][1]) < max(b.minHole, 1) {
		b.ext[k-1][1] = max(end, b.ext[k-1][0]+b.ext[k-1][1]) - b.ext[k-1][0]
		return
	}
	b.ext = append(b.ext, [2]int64{off, end - off})
	for len(b.ext) > MaxExtents {
		b.minHole = max(2*b.minHole, 64<<10)
		merged := b.ext[:1]
		for _, x := range b.ext[1:] {
			last := &merged[len(merged)-1]
			if x[0]-(last[0]+last[1]) < b.minHole {
				last[1] = x[0] + x[1] - last[0]
			} else {
				merged = append(merged, x)
			}
		}
		b.ext = merged
	}
}

// Find finds f's data regions within size by SEEK_DATA and SEEK_HOLE. A
// file system that does not track its holes (gVisor's files, seen from
// inside a sandbox) reports all of the file as data: Scan finds them then.
func Find(f *os.File, size int64) (Extents, error) {
	b := builder{size: size}
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, syscall.ENXIO) {
			break
		}
		if err != nil {
			return nil, err
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return nil, err
		}
		hole = min(hole, size)
		if hole <= data {
			break
		}
		b.add(data, hole-data)
		off = hole
	}
	return b.ext, nil
}

// Block is the unit of extents and the one Scan finds holes in: a file
// system's block.
const Block = 4096

// Scan reads the regions ext of f (whole blocks, as Find gives) and gives
// those of its blocks that hold a byte other than zero: the data of a file
// whose file system reports its holes as data. buf's length is how much is
// read at once. A file that shrank meanwhile ends where it ends. It stops
// with ctx's error once ctx is done: a scan of a large file reads for
// minutes and writes nothing, so nothing else tells it that its reader is
// gone.
func Scan(ctx context.Context, f *os.File, ext Extents, buf []byte) (Extents, error) {
	var b builder
	if k := len(ext); k > 0 {
		b.size = ext[k-1][0] + ext[k-1][1]
	}
	zero := make([]byte, Block)
	for _, x := range ext {
		for off, end := x[0], x[0]+x[1]; off < end; {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			n, err := f.ReadAt(buf[:min(int64(len(buf)), end-off)], off)
			dataRuns(buf[:n], off, zero, func(i, j int) { b.add(off+int64(i), int64(j-i)) })
			off += int64(n)
			if err == io.EOF || (err == nil && n == 0) {
				break
			}
			if err != nil {
				return nil, err
			}
		}
	}
	return b.ext, nil
}

// Probe reads n blocks of f picked at random within size and reports
// whether one of them is all zeros: whether the file is worth a Scan, the
// read of all of it that finds its holes where nothing else says where
// they are. A file whose blocks of zeros are a fraction h of it passes
// every probe with probability (1-h)^n (with 64, 0.1% for h = 10%), and a
// file without, which is most, costs n small reads, not a second read of
// all of it. Random, so that no file is made to pass them.
func Probe(f *os.File, size int64, n int) (bool, error) {
	blocks := size / Block
	if blocks == 0 {
		return false, nil
	}
	buf := make([]byte, Block)
	zero := make([]byte, Block)
	for range n {
		k, err := f.ReadAt(buf, rand.Int64N(blocks)*Block)
		if err != nil && err != io.EOF {
			return false, err
		}
		if k == Block && bytes.Equal(buf, zero) {
			return true, nil
		}
	}
	return false, nil
}

// dataRuns calls data(i, j) for each run p[i:j] that holds a byte other
// than zero, p being at offset off of its file: what is left out are its
// blocks of zeros (whole, or the part of one at p's ends). zero is a block
// of zeros.
func dataRuns(p []byte, off int64, zero []byte, data func(i, j int)) {
	start := 0 // of the run of data so far
	for i := 0; i < len(p); {
		k := min(len(p)-i, Block-int((off+int64(i))%Block)) // to the next block's start
		if bytes.Equal(p[i:i+k], zero[:k]) {
			if start < i {
				data(start, i)
			}
			start = i + k
		}
		i += k
	}
	if start < len(p) {
		data(start, len(p))
	}
}

// HoleWriter writes a new file from its start, leaving its blocks of
// zeros holes: they are seeked past, never written, so what it writes is
// the data, whatever the size.
type HoleWriter struct {
	f    *os.File
	n    int64 // where the next write goes
	zero []byte
}

// NewHoleWriter writes f, which is empty.
func NewHoleWriter(f *os.File) *HoleWriter {
	return &HoleWriter{f: f, zero: make([]byte, Block)}
}

func (w *HoleWriter) Write(p []byte) (int, error) {
	var err error
	dataRuns(p, w.n, w.zero, func(i, j int) {
		if err == nil {
			_, err = w.f.WriteAt(p[i:j], w.n+int64(i))
		}
	})
	if err != nil {
		return 0, err
	}
	w.n += int64(len(p))
	return len(p), nil
}

// Close sets the file's size to what was written (it may end in a hole).
func (w *HoleWriter) Close() error { return w.f.Truncate(w.n) }

// WriteExtents writes the extents' data, read in order from r, into f and
// sets its size: what is not in an extent is a hole.
func WriteExtents(f *os.File, size int64, ext Extents, r io.Reader) error {
	for _, x := range ext {
		if _, err := io.CopyN(io.NewOffsetWriter(f, x[0]), r, x[1]); err != nil {
			return fmt.Errorf("extent at %d: %w", x[0], err)
		}
	}
	return f.Truncate(size)
}

// ReadExtents writes the extents' data of f to w, in order.
func ReadExtents(f *os.File, ext Extents, w io.Writer) error {
	for _, x := range ext {
		if _, err := io.Copy(w, io.NewSectionReader(f, x[0], x[1])); err != nil {
			return err
		}
	}
	return nil
}

// The PAX records of a sparse file's tar entry, whose data are its
// extents' bytes in order: the file's size, and its extents (String).
const (
	RecordSize    = client.SparseSizeRecord
	RecordExtents = client.SparseExtentsRecord
)

// Header makes hdr the entry of a sparse file of size bytes whose data are
// ext: its Size is their bytes, its records say where they go.
func Header(hdr *tar.Header, size int64, ext Extents) {
	hdr.Size = ext.Bytes()
	hdr.Format = tar.FormatPAX
	if hdr.PAXRecords == nil {
		hdr.PAXRecords = map[string]string{}
	}
	hdr.PAXRecords[RecordSize] = strconv.FormatInt(size, 10)
	hdr.PAXRecords[RecordExtents] = ext.String()
}

// FromHeader reads the size and extents of a sparse file's entry; ok is
// false for an entry without them (a file sent whole). The records are
// checked as hostile: extents in order, within the size, and exactly the
// entry's data.
func FromHeader(hdr *tar.Header) (size int64, ext Extents, ok bool, err error) {
	s, hasSize := hdr.PAXRecords[RecordSize]
	e, hasExt := hdr.PAXRecords[RecordExtents]
	if !hasSize && !hasExt {
		return 0, nil, false, nil
	}
	size, err = strconv.ParseInt(s, 10, 64)
	if err != nil || size < 0 {
		return 0, nil, false, fmt.Errorf("%s: no size", hdr.Name)
	}
	if ext, err = Parse(e, size); err != nil {
		return 0, nil, false, fmt.Errorf("%s: %w", hdr.Name, err)
	}
	if ext.Bytes() != hdr.Size {
		return 0, nil, false, fmt.Errorf("%s: extents of %d bytes, entry of %d", hdr.Name, ext.Bytes(), hdr.Size)
	}
	return size, ext, true, nil
}
