package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// layerSource is one layer of an image being installed.
type layerSource struct {
	diffID string                        // sha256 of the uncompressed tar, from the image config
	id     string                        // short name for progress: 12 hex digits of its digest
	size   int64                         // bytes open yields (for progress); 0 if unknown
	open   func() (io.ReadCloser, error) // the blob: gzip, zstd or plain tar
}

// haveLayerLocked reports whether diffID is unpacked and in place.
func (s *Store) haveLayerLocked(diffID string) bool {
	lr := s.idx.Layers[diffID]
	if lr == nil {
		return false
	}
	if _, err := os.Lstat(s.path("l", lr.Dir)); err != nil {
		delete(s.idx.Layers, diffID) // removed behind our back: unpack again
		return false
	}
	return true
}

// ensureLayer unpacks a layer unless it already is. The per-diffID lock
// makes concurrent pulls of one layer unpack it once; the others wait and
// find it done.
func (s *Store) ensureLayer(ctx context.Context, ls layerSource, rep *reporter) error {
	unlock, err := s.layerLocks.lock(ctx, ls.diffID)
	if err != nil {
		return err
	}
	defer unlock()
	s.mu.Lock()
	have := s.haveLayerLocked(ls.diffID)
	s.mu.Unlock()
	if have {
		rep.add(0, ls.size) // counted in Total when we thought we needed it
		rep.send(Progress{Layer: ls.id, Status: StatusExists, LayerTotal: ls.size, LayerDone: ls.size})
		return nil
	}
	rep.send(Progress{Layer: ls.id, Status: StatusDownloading, LayerTotal: ls.size})
	counted, err := s.unpack(ctx, ls, rep)
	if err != nil {
		return err
	}
	if ls.size > counted { // keep Done == Total at the end even if size was off
		rep.add(0, ls.size-counted)
	}
	rep.send(Progress{Layer: ls.id, Status: StatusComplete, LayerTotal: ls.size, LayerDone: ls.size})
	return nil
}

// unpack streams the layer blob through decompression and verification
// into a temp dir, then renames it into l/. It returns the blob bytes read.
func (s *Store) unpack(ctx context.Context, ls layerSource, rep *reporter) (int64, error) {
	tmp, err := os.MkdirTemp(s.path("tmp"), "layer-")
	if err != nil {
		return 0, s.storeErr("make a directory to unpack a layer into", err)
	}
	defer func() {
		if tmp != "" {
			_ = os.RemoveAll(tmp)
		}
	}()
	// The layer's root, unless the layer sets it. Only root may reach it:
	// l/ (and tmp/) are 0700.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return 0, s.storeErr("make a directory to unpack a layer into", err)
	}
	rc, err := ls.open()
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	blob := &countingReader{r: ctxReader{ctx, rc}, rep: rep, layer: ls.id, size: ls.size}
	plain, err := decompress(blob)
	if err != nil {
		return 0, fmt.Errorf("layer %s: %w", ls.id, err)
	}
	defer plain.Close()
	h := sha256.New()
	tarSize := &byteCounter{}
	tr := io.TeeReader(plain, io.MultiWriter(h, tarSize))
	content, err := unpackLayer(tr, tmp, func(msg string, args ...any) {
		s.log.Warn(msg, append(args, "layer", ls.diffID)...)
	})
	if err == nil { // the tar's trailing padding is part of the diffID
		_, err = io.Copy(io.Discard, tr)
	}
	if err == nil { // read the blob to its end: that is when its digest is checked
		_, err = io.Copy(io.Discard, blob)
	}
	if err != nil {
		return blob.n, fmt.Errorf("layer %s: %w", ls.id, err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != ls.diffID {
		return blob.n, fmt.Errorf("layer %s: content does not match the image config (diffID %s, got %s)", ls.id, ls.diffID, got)
	}
	for _, d := range content.devices {
		switch {
		case !d.valid():
			s.log.Warn("layer holds a device node with impossible numbers: sandboxes do not get it", "layer", ls.diffID, "path", d.Path, "major", d.Major, "minor", d.Minor)
		case !strings.HasPrefix(d.Path, "/dev/"):
			// oci.Build makes devices under /dev only: elsewhere the node
			// would land on a host filesystem (the sandbox's upper dir).
			s.log.Warn("layer holds a device node outside /dev: sandboxes do not get it", "layer", ls.diffID, "path", d.Path)
		default:
			s.log.Debug("layer holds a device node: recorded, for the runtime to make inside sandboxes", "layer", ls.diffID, "path", d.Path)
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	dir := s.layerDirNameLocked(ls.diffID)
	dst := s.path("l", dir)
	if _, err := os.Lstat(dst); err == nil { // a stale dir no record keeps
		if t := s.trashLocked(dst); t != "" {
			defer os.RemoveAll(t)
		}
	}
	// Renamed under s.mu so GC never sees an unrecorded dir in l/.
	if err := os.Rename(tmp, dst); err != nil {
		return blob.n, s.storeErr("move an unpacked layer into place", err)
	}
	tmp = ""
	s.idx.Layers[ls.diffID] = &layerRecord{Dir: dir, Size: content.size, TarSize: tarSize.n, Format: layerFormat, Devices: content.devices}
	return blob.n, s.saveLocked()
}

// layerDirNameLocked names a layer dir by the first 16 hex digits of its
// diffID, longer only in the (astronomically unlikely) event of a clash.
// Short names keep overlayfs lowerdir lists within a page.
func (s *Store) layerDirNameLocked(diffID string) string {
	h := trimAlgo(diffID)
	for n := 16; n < len(h); n += 8 {
		taken := false
		for d, lr := range s.idx.Layers {
			if lr.Dir == h[:n] && d != diffID {
				taken = true
				break
			}
		}
		if !taken {
			return h[:n]
		}
	}
	return h
}

var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// decompress detects gzip and zstd by their magic numbers rather than
// trusting media types, which docker archives and some registries get wrong.
func decompress(r io.Reader) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	magic, err := br.Peek(4)
	if err != nil && err != io.EOF {
		return nil, err
	}
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		return gzip.NewReader(br)
	case bytes.HasPrefix(magic, zstdMagic):
		d, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, err
		}
		return d.IOReadCloser(), nil
	}
	return io.NopCloser(br), nil
}

// ctxReader stops a long copy when the context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

type byteCounter struct{ n int64 }

func (b *byteCounter) Write(p []byte) (int, error) {
	b.n += int64(len(p))
	return len(p), nil
}
