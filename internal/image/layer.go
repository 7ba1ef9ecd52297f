package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/useshards/shard/internal/errdefs"
)

// layerSource is one layer of an image being installed.
type layerSource struct {
	diffID string                        // sha256 of the uncompressed tar, from the image config
	digest string                        // the blob's digest (the diffID for an archive's plain tars), for messages
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

// ensureLayer unpacks a layer unless it already is, within the image's
// budget. The per-diffID lock makes concurrent pulls of one layer unpack
// it once; the others wait and find it done.
func (s *Store) ensureLayer(ctx context.Context, ls layerSource, rep *reporter, b *budget) error {
	unlock, err := s.layerLocks.lock(ctx, ls.diffID)
	if err != nil {
		return err
	}
	defer unlock()
	s.mu.Lock()
	var done *layerRecord
	if s.haveLayerLocked(ls.diffID) {
		cp := *s.idx.Layers[ls.diffID]
		done = &cp
	}
	s.mu.Unlock()
	if done != nil { // another pull unpacked it meanwhile
		if err := b.cached(done, ls.digest); err != nil {
			return err
		}
		rep.add(0, ls.size) // counted in Total when we thought we needed it
		rep.send(Progress{Layer: ls.id, Status: StatusExists, LayerTotal: ls.size, LayerDone: ls.size})
		return nil
	}
	rep.send(Progress{Layer: ls.id, Status: StatusDownloading, LayerTotal: ls.size})
	counted, err := s.unpack(ctx, ls, rep, b)
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
// Whatever fails, the temp dir goes and nothing is recorded.
func (s *Store) unpack(ctx context.Context, ls layerSource, rep *reporter, b *budget) (int64, error) {
	if err := b.checkDisk(); err != nil {
		return 0, err
	}
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
		return 0, fmt.Errorf("layer %s: %w", ls.digest, err) // the registry's or the archive's
	}
	defer rc.Close()
	src := &errReader{r: rc} // the blob's own failures: the registry's or the archive's, not the layer's
	blob := &countingReader{r: ctxReader{ctx, src}, rep: rep, layer: ls.id, size: ls.size}
	content, tarSize, err := s.unpackBlob(ctx, ls, blob, tmp, b)
	if err != nil {
		return blob.n, s.layerErr(ctx, ls, b, src.err, err)
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
	s.idx.Layers[ls.diffID] = &layerRecord{Dir: dir, Size: content.size, TarSize: tarSize, Format: layerFormat, Devices: content.devices}
	return blob.n, s.saveLocked()
}

// unpackBlob decompresses the blob, unpacks its tar into dir and checks
// it against the diffID, counting the tar and its files against b.
func (s *Store) unpackBlob(ctx context.Context, ls layerSource, blob io.Reader, dir string, b *budget) (layerContent, int64, error) {
	plain, err := decompress(blob)
	if err != nil {
		return layerContent{}, 0, err
	}
	defer plain.Close()
	h := sha256.New()
	tarSize := &byteCounter{}
	tr := io.TeeReader(&budgetReader{r: plain, b: b, layer: ls.digest}, io.MultiWriter(h, tarSize))
	content, err := unpackLayer(ctx, tr, dir, b, ls.digest, func(msg string, args ...any) {
		s.log.Warn(msg, append(args, "layer", ls.diffID)...)
	})
	if err == nil { // the tar's trailing padding is part of the diffID (and counts against b)
		_, err = io.Copy(io.Discard, tr)
	}
	if err == nil { // read the blob to its end: that is when its digest is checked
		_, err = io.Copy(io.Discard, blob)
	}
	if err != nil {
		return layerContent{}, 0, err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != ls.diffID {
		return layerContent{}, 0, fmt.Errorf("its content does not match the image config (diffID %s, got %s)", ls.diffID, got)
	}
	return content, tarSize.n, nil
}

// layerErr classifies a failure to unpack a layer. The budget's and the
// store's own errors are already classified; a cancelled context is the
// caller's; a failure of the blob's own reads is the registry's or the
// archive's (classify and importErr tell); a full disk is the host's, and
// so are a few other errnos (the server's fault: 500); anything else the
// unpacker met is the layer's: invalid_image, naming the layer and the
// image.
func (s *Store) layerErr(ctx context.Context, ls layerSource, b *budget, blobErr, err error) error {
	var he *hostErr
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("layer %s: %w", ls.digest, ctx.Err())
	case errors.As(err, &he):
		return s.storeErr("unpack a layer", he.error)
	}
	if e, ok := errdefs.As(err); ok {
		return e // the budget's, the disk's
	}
	switch {
	case blobErr != nil:
		return fmt.Errorf("layer %s: %w", ls.digest, blobErr)
	case errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT):
		s.log.Error("image store failure", "op", "unpack a layer", "err", err)
		return &errdefs.Error{Kind: errdefs.KindNoSpace, Code: codeNoSpace, Err: err,
			Msg: fmt.Sprintf("not enough disk space for %s: the server's disk is full; free space (remove images, sandboxes, snapshots or checkpoints) and try again", b.what)}
	case hostErrno(err):
		return s.storeErr("unpack a layer", err)
	}
	return invalidImage(err, "layer %s of %s is not a valid layer: %v", ls.digest, b.what, err)
}

// hostErr marks a failure of the host, not of the layer.
type hostErr struct{ error }

func (e *hostErr) Unwrap() error { return e.error }

// hostErrno reports a failure of the host's disk or resources that no
// layer content causes.
func hostErrno(err error) bool {
	for _, e := range []syscall.Errno{syscall.EIO, syscall.EROFS, syscall.ENOMEM, syscall.EMFILE, syscall.ENFILE,
		syscall.EACCES, syscall.EBADF, syscall.EUCLEAN, syscall.ESTALE, syscall.ENXIO, syscall.ENODEV} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
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
