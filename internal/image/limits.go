package image

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/units"
)

// An image is untrusted input, and so is an upload: neither may take the
// host's disk or memory. What bounds them:
//
//   - One image (Options.MaxImageSize, DefaultMaxImageSize unless set):
//     the bytes its layers decompress to (the tar streams, whatever a
//     gzip or zstd bomb makes of a small blob) and the bytes of its files
//     (a sparse file at its full size, though it is written with holes),
//     each summed over all its layers, cached ones included. Counted as
//     the layers are read, so a bomb stops at the limit, not after.
//   - An import's upload: the same size, spooled; a gzipped archive's
//     uncompressed stream too.
//   - The host: whatever the store writes leaves the host's reserve
//     (Options.Disk: shard serve --reserve) and 5% of its inodes free,
//     checked before each layer and every diskCheckEvery bytes after; the
//     store as a whole has no other bound.
//   - JSON read whole into memory: manifests and indexes maxManifestSize,
//     configs maxConfigSize, checked before they are read (a layout's or
//     an archive's files by their size on disk, a registry's answers as
//     they come).
//   - Layers: at most maxLayers distinct ones per image (overlayfs stacks
//     no more).

// DefaultMaxImageSize is Options.MaxImageSize when it is not set.
const DefaultMaxImageSize = 16 << 30

const (
	maxManifestSize = 4 << 20  // manifests, indexes, index.json, manifest.json: distribution's own limit
	maxConfigSize   = 16 << 20 // image configs
	maxLayers       = 500      // overlayfs's OVL_MAX_STACK

	diskCheckEvery = 32 << 20
)

// Codes of the errors these bounds give.
const (
	codeImageTooLarge = client.CodeImageTooLarge // 413: an image over MaxImageSize
	codeUploadTooBig  = client.CodeTooLarge      // 413: an upload over MaxImageSize
	codeNoSpace       = client.CodeInsufficientStorage
	codeInvalidImage  = client.CodeInvalidImage // 422: an image that is not what an image must be
)

// limitText says the bound of one image, and where it is set.
func (s *Store) limitText(what string) string {
	return units.FormatSize(s.maxImage) + what + ", the most this server takes for one image (shard serve --max-image-size)"
}

// invalidImage is the error of an image whose content is malformed or
// hostile: the user's (or the registry's) doing, not the server's.
func invalidImage(err error, format string, args ...any) error {
	return &errdefs.Error{Kind: errdefs.KindFailed, Code: codeInvalidImage, Msg: fmt.Sprintf(format, args...), Err: err}
}

// checkDisk fails when the store's filesystem is down to the host's
// reserve (shard serve --reserve) or to 5% of its inodes. what names what
// was being written, for the message.
func (s *Store) checkDisk(what string) error {
	return s.disk.Check(what)
}

// budget bounds what installing one image (or unpacking one archive)
// may read and write; the layers of an image unpack in parallel and share
// it.
type budget struct {
	s       *Store
	what    string // `image "x"` or "the upload", for messages
	archive bool   // an archive being unpacked, not an image's layers
	limit   int64
	stream  atomic.Int64 // bytes of decompressed tar read
	content atomic.Int64 // bytes of file content, sparse files at full size
	since   atomic.Int64 // bytes since the last look at the disk
}

func (s *Store) newBudget(what string, archive bool) *budget {
	return &budget{s: s, what: what, archive: archive, limit: s.maxImage}
}

// read counts n bytes of decompressed tar of layer (a digest, "" for an
// archive).
func (b *budget) read(n int64, layer string) error {
	if b == nil {
		return nil
	}
	if b.stream.Add(n) > b.limit {
		return b.tooLarge(true, layer)
	}
	return b.tick(n)
}

// write counts n bytes of file content.
func (b *budget) write(n int64, layer string) error {
	if b == nil {
		return nil
	}
	if b.content.Add(n) > b.limit {
		return b.tooLarge(false, layer)
	}
	return b.tick(n)
}

// cached counts a layer the image shares with the cache: it takes no room
// now, but the image is as large with it.
func (b *budget) cached(lr *layerRecord, layer string) error {
	if b.stream.Add(lr.TarSize) > b.limit {
		return b.tooLarge(true, layer)
	}
	if b.content.Add(lr.Size) > b.limit {
		return b.tooLarge(false, layer)
	}
	return nil
}

func (b *budget) tick(n int64) error {
	if b.since.Add(n) < diskCheckEvery {
		return nil
	}
	b.since.Store(0)
	return b.checkDisk()
}

func (b *budget) checkDisk() error {
	if b == nil {
		return nil
	}
	return b.s.checkDisk(b.what)
}

// tooLarge is the error of a spent budget: decompressed says which count.
func (b *budget) tooLarge(decompressed bool, layer string) error {
	const sparse = " of files (a sparse file counted at its full size)"
	var msg string
	switch {
	case b.archive && decompressed:
		msg = fmt.Sprintf("cannot import %s: it decompresses to more than %s", b.what, b.s.limitText(""))
	case b.archive:
		msg = fmt.Sprintf("cannot import %s: it holds more than %s", b.what, b.s.limitText(sparse))
	case decompressed:
		msg = fmt.Sprintf("%s is too large: its layers decompress to more than %s", b.what, b.s.limitText(""))
	default:
		msg = fmt.Sprintf("%s is too large: its layers hold more than %s", b.what, b.s.limitText(sparse))
	}
	if layer != "" {
		msg += "; at layer " + layer
	}
	return errdefs.New(errdefs.KindTooLarge, codeImageTooLarge, "%s", msg)
}

// budgetReader counts what a decompressor yields against a budget.
type budgetReader struct {
	r     io.Reader
	b     *budget
	layer string
}

func (r *budgetReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		if berr := r.b.read(int64(n), r.layer); berr != nil {
			return n, berr
		}
	}
	return n, err
}

// errDocTooLarge is a JSON document over its limit.
type errDocTooLarge struct {
	doc   string // "manifest", "config", ...
	limit int64
}

func (e *errDocTooLarge) Error() string {
	return fmt.Sprintf("its %s is larger than %s", e.doc, units.FormatSize(e.limit))
}

// docTooLarge classifies an errDocTooLarge in err for the image what.
func docTooLarge(err error, what string) (error, bool) {
	var d *errDocTooLarge
	if !errors.As(err, &d) {
		return nil, false
	}
	return &errdefs.Error{Kind: errdefs.KindTooLarge, Code: codeImageTooLarge,
		Msg: fmt.Sprintf("image %q is too large: %v, the most this server reads", what, d), Err: err}, true
}

// checkDoc refuses a document its descriptor says is over limit.
func checkDoc(d v1.Descriptor, doc string, limit int64) error {
	if d.Size > limit {
		return &errDocTooLarge{doc: doc, limit: limit}
	}
	return nil
}

// checkLayoutBlob refuses a document of an OCI layout whose file is over
// limit, before go-containerregistry reads it whole.
func checkLayoutBlob(dir string, d v1.Descriptor, doc string, limit int64) error {
	if err := checkDoc(d, doc, limit); err != nil {
		return err
	}
	return checkFile(filepath.Join(dir, "blobs", d.Digest.Algorithm, d.Digest.Hex), doc, limit)
}

// checkFile refuses a file over limit (a missing one is left for the
// reader to report).
func checkFile(p, doc string, limit int64) error {
	if fi, err := os.Stat(p); err == nil && fi.Size() > limit {
		return &errDocTooLarge{doc: doc, limit: limit}
	}
	return nil
}

// limitedManifests is a transport that cuts registry answers for
// manifests and indexes off at maxManifestSize: go-containerregistry reads
// them whole, up to 100 MiB.
type limitedManifests struct{ http.RoundTripper }

func (t limitedManifests) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.RoundTripper.RoundTrip(req)
	if err != nil || !isManifestPath(req.URL.Path) {
		return resp, err
	}
	if resp.ContentLength > maxManifestSize {
		resp.Body.Close()
		return nil, &errDocTooLarge{doc: "manifest", limit: maxManifestSize}
	}
	resp.Body = &limitedBody{ReadCloser: resp.Body, left: maxManifestSize}
	return resp, nil
}

// isManifestPath tells /v2/NAME/manifests/REF (a reference has no '/')
// from a blob of a repository that has "manifests" in its name.
func isManifestPath(p string) bool {
	i := strings.LastIndex(p, "/manifests/")
	return i >= 0 && !strings.Contains(p[i+len("/manifests/"):], "/")
}

type limitedBody struct {
	io.ReadCloser
	left int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, &errDocTooLarge{doc: "manifest", limit: maxManifestSize}
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return 0, &errDocTooLarge{doc: "manifest", limit: maxManifestSize}
	}
	return n, err
}
