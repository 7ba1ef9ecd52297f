package image

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
	"runtime"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/klauspost/compress/gzip"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
)

// Annotations that name an image in an OCI layout. containerd and docker
// (25+) write the full reference in the first; the OCI one is often only
// a tag, so it names the image only when it looks like a full reference.
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

// importEntry is one image found in an archive, with the references
// (canonical keys) it should get.
type importEntry struct {
	src  *source
	keys []string
}

// archive is an archive being imported.
type archive struct {
	file string // where it is
	what string // how messages name it: the path the caller gave, or "the upload"
	base string // what an image it does not name is called in messages
	tmp  string // where readArchive unpacked an OCI layout tarball
}

// Import loads the images in path: an OCI image layout directory, a
// tarball of one, or a docker-archive tarball (`docker save`); tarballs
// may be gzipped. ref, if given, becomes the image's only reference; it
// is required when the archive names no image and refused when it holds
// several. Messages name the archive by path.
func (s *Store) Import(ctx context.Context, path string, ref string) ([]*Image, error) {
	if err := project.Require(ctx); err != nil { // an import is made in ctx's project
		return nil, err
	}
	a := &archive{file: path, what: path, base: filepath.Base(path)}
	imgs, err := s.importArchive(ctx, a, ref, nil)
	return imgs, s.public(err, a.names())
}

// ImportStream imports an archive read from r (an upload), as Import does
// a file. It is spooled under the store's tmp/, which only root can reach,
// and removed when done (or, after a crash, by the next Open). Messages
// call it "the upload" and never name a host path.
func (s *Store) ImportStream(ctx context.Context, r io.Reader, ref string) ([]*Image, error) {
	if err := project.Require(ctx); err != nil { // before the upload is read
		return nil, err
	}
	a, done, err := s.spool(ctx, r, "the upload", "upload")
	defer done()
	if err != nil {
		return nil, err
	}
	imgs, err := s.importArchive(ctx, a, ref, nil)
	return imgs, s.public(err, a.names())
}

// spool writes an archive read from r into the store's tmp/, within the
// bound of one image; done removes it. what names it in messages.
func (s *Store) spool(ctx context.Context, r io.Reader, what, base string) (a *archive, done func(), err error) {
	f, err := os.CreateTemp(s.path("tmp"), "upload-")
	if err != nil {
		return nil, func() {}, s.storeErr("keep "+what, err)
	}
	done = func() { f.Close(); os.Remove(f.Name()) }
	a = &archive{file: f.Name(), what: what, base: base}
	src := &errReader{r: ctxReader{ctx, r}}
	err = s.checkDisk(a.what)
	if err == nil {
		_, err = io.Copy(&spoolWriter{f: f, s: s, what: a.what}, src)
	}
	if err == nil {
		err = f.Close()
	}
	var classified *errdefs.Error
	switch {
	case err == nil:
		return a, done, nil
	case ctx.Err() != nil:
		return nil, done, fmt.Errorf("import: %w", ctx.Err())
	case errors.As(err, &classified):
		return nil, done, classified // over the limit, or the disk at its reserve
	case src.err != nil:
		return nil, done, errdefs.Invalid("cannot import %s: reading it failed: %v", what, s.public(src.err, a.names()))
	default:
		return nil, done, s.storeErr("keep "+what, err)
	}
}

// UploadTooLarge is the error of an upload over the store's bound, for
// callers that know an upload's size before they read it.
func (s *Store) UploadTooLarge(what string) error {
	return errdefs.New(errdefs.KindTooLarge, codeUploadTooBig, "cannot import %s: it is larger than %s", what, s.limitText(""))
}

// spoolWriter writes an upload to its spool file, up to the store's bound,
// looking at the disk's free space as it goes.
type spoolWriter struct {
	f     *os.File
	s     *Store
	what  string
	n     int64
	since int64
}

func (w *spoolWriter) Write(p []byte) (int, error) {
	if w.n+int64(len(p)) > w.s.maxImage {
		return 0, w.s.UploadTooLarge(w.what)
	}
	if w.since += int64(len(p)); w.since >= diskCheckEvery {
		w.since = 0
		if err := w.s.checkDisk(w.what); err != nil {
			return 0, err
		}
	}
	n, err := w.f.Write(p)
	w.n += int64(n)
	return n, err
}

// names maps the host paths of an import to what messages say instead:
// paths inside an unpacked layout read as the archive's own.
func (a *archive) names() map[string]string {
	m := map[string]string{a.file: a.what}
	if a.tmp != "" {
		m[a.tmp+"/"] = ""
		m[a.tmp] = a.what
	}
	return m
}

// errReader remembers the error of the reader it wraps, so that a copy
// can tell a failed read from a failed write.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		e.err = err
	}
	return n, err
}

// importArchive imports the images of a; cp, when set, makes it a copy of
// another node's import (checked against the digest the cluster records
// for it).
func (s *Store) importArchive(ctx context.Context, a *archive, ref string, cp *copyOf) ([]*Image, error) {
	var named name.Reference
	if strings.TrimSpace(ref) != "" {
		r, err := s.importRef(ref)
		if err != nil {
			return nil, err
		}
		named = r
	}
	entries, cleanup, err := s.readArchive(ctx, a)
	defer cleanup()
	if err != nil {
		return nil, importErr(ctx, a.what, err)
	}
	switch {
	case len(entries) == 0:
		return nil, errdefs.Invalid("cannot import %s: it holds no linux/%s image", a.what, runtime.GOARCH)
	case named != nil && len(entries) > 1:
		return nil, errdefs.Invalid("cannot import %s: it holds %d images, and a name can only be given to a single image", a.what, len(entries))
	case named != nil:
		entries[0].keys = []string{canonical(named)}
		entries[0].src.what = familiar(named)
	}
	if cp != nil {
		if err := cp.check(a, entries); err != nil {
			return nil, err
		}
	}
	for i, e := range entries {
		if len(e.keys) == 0 {
			return nil, errdefs.Invalid("cannot import %s: the archive does not name its image; give a name, e.g. \"localhost/myimage:latest\"", a.what)
		}
		// Every name goes under localhost/, in the importer's project.
		if entries[i].keys, err = localizeKeys(ctx, e.keys); err != nil {
			return nil, err
		}
		_, canon := splitKey(entries[i].keys[0])
		entries[i].src.what = familiarOf(canon)
	}
	var out []*Image
	for _, e := range entries {
		imgs, err := s.importEntry(ctx, a, e, cp)
		if err != nil {
			return nil, err
		}
		out = append(out, imgs...)
	}
	return out, nil
}

// importEntry installs one image of an archive and points its references
// at it. In a cluster (a registry set), an import made here keeps its
// layer blobs (for the other nodes' copies) and is claimed in the
// registry before it is committed: a name another node's import holds is
// refused, and nothing is kept.
func (s *Store) importEntry(ctx context.Context, a *archive, e importEntry, cp *copyOf) ([]*Image, error) {
	if s.reg != nil && cp == nil {
		keys := slices.Sorted(slices.Values(e.keys))
		for _, k := range keys {
			unlock, err := s.refLocks.lock(ctx, k)
			if err != nil {
				return nil, err
			}
			defer unlock()
		}
	}
	in, err := s.install(ctx, e.src, nil)
	if err != nil {
		return nil, importErr(ctx, a.what, err)
	}
	unpinned := false
	unpin := func() {
		if !unpinned {
			unpinned = true
			s.unpin(in.pins...)
		}
	}
	defer unpin()
	fail := func(err error) ([]*Image, error) {
		unpin()
		s.dropUnused() // what this import alone brought
		return nil, err
	}
	if cp == nil {
		if s.reg != nil { // a single host sends its imports nowhere
			if err := s.keepBlobs(ctx, e.src, in); err != nil {
				return fail(importErr(ctx, a.what, err))
			}
		}
		undo, err := s.claim(ctx, e.keys, in.digest)
		if err != nil {
			return fail(err)
		}
		defer func() {
			if undo != nil {
				undo()
			}
		}()
		imgs, err := s.commit(e.keys, in)
		if err != nil {
			return fail(err)
		}
		undo = nil
		s.log.Info("imported image", "image", e.src.what, "digest", in.digest)
		return imgs, nil
	}
	in.origin = cp.origin
	imgs, err := s.commit(e.keys, in)
	if err != nil {
		return fail(err)
	}
	s.log.Info("copied image from another node", "image", e.src.what, "digest", in.digest, "from", cp.origin)
	return imgs, nil
}

// readArchive finds the images in an archive. cleanup removes the temp
// copy of an OCI layout tarball once the images are installed.
func (s *Store) readArchive(ctx context.Context, a *archive) (entries []importEntry, cleanup func(), err error) {
	cleanup = func() {}
	fi, err := os.Stat(a.file)
	if err != nil {
		return nil, cleanup, errdefs.Invalid("cannot import %s: %v", a.what, pathErr(err))
	}
	if fi.IsDir() {
		if _, err := os.Stat(filepath.Join(a.file, "oci-layout")); err != nil {
			return nil, cleanup, errdefs.Invalid("cannot import %s: a directory must be an OCI image layout (it has no oci-layout file)", a.what)
		}
		entries, err = s.layoutEntries(a.file)
		return entries, cleanup, err
	}
	if fi.Size() > s.maxImage {
		return nil, cleanup, s.UploadTooLarge(a.what)
	}
	kind, gz, files, err := s.sniffArchive(ctx, a)
	if err != nil {
		if _, ok := errdefs.As(err); ok || ctx.Err() != nil {
			return nil, cleanup, err
		}
		return nil, cleanup, errdefs.Invalid("cannot import %s: not a readable tar archive: %v", a.what, pathErr(err))
	}
	switch kind {
	case "oci":
		tmp, err := os.MkdirTemp(s.path("tmp"), "import-")
		if err != nil {
			return nil, cleanup, s.storeErr("unpack the archive", err)
		}
		a.tmp = tmp
		cleanup = func() { _ = os.RemoveAll(tmp) }
		if err := s.extractArchive(ctx, a, gz, tmp); err != nil {
			return nil, cleanup, err
		}
		entries, err = s.layoutEntries(tmp)
		return entries, cleanup, err
	case "docker":
		entries, err = s.dockerEntries(ctx, a, gz, files)
		return entries, cleanup, err
	}
	return nil, cleanup, errdefs.Invalid("cannot import %s: it is neither an OCI image layout nor a docker archive (docker save)", a.what)
}

// layoutEntries lists the images of an OCI layout, picking this machine's
// platform from multi-arch indexes.
func (s *Store) layoutEntries(dir string) ([]importEntry, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, err
	}
	// go-containerregistry reads a layout's documents whole: their sizes
	// on disk are checked first.
	if err := checkFile(filepath.Join(dir, "index.json"), "index.json", maxManifestSize); err != nil {
		return nil, err
	}
	check := func(d v1.Descriptor, doc string, limit int64) error { return checkLayoutBlob(dir, d, doc, limit) }
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var out []importEntry
	for _, d := range im.Manifests {
		if pl := d.Platform; pl != nil && d.MediaType.IsImage() && (pl.OS != "linux" || pl.Architecture != runtime.GOARCH) {
			continue // a flattened multi-platform layout: other platforms' images
		}
		e := importEntry{src: &source{what: shortHex(d.Digest.String()), digest: d.Digest.String()}}
		if key, ok := s.annotatedName(d.Annotations); ok {
			e.keys, e.src.what = []string{key}, familiarOf(key)
		}
		var img v1.Image
		switch {
		case d.MediaType.IsIndex():
			if err := check(d, "index", maxManifestSize); err != nil {
				return nil, err
			}
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, err
			}
			if e.src.index, err = child.RawManifest(); err != nil {
				return nil, err
			}
			img, err = imageFromIndex(child, e.src.what, check)
			if err != nil {
				return nil, err
			}
		case d.MediaType.IsImage():
			if err := check(d, "manifest", maxManifestSize); err != nil {
				return nil, err
			}
			if img, err = idx.Image(d.Digest); err != nil {
				return nil, err
			}
		default:
			continue // signatures, attestations and other artifacts
		}
		if _, err := imageSource(e.src, img, check); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

func (s *Store) annotatedName(ann map[string]string) (string, bool) {
	for _, k := range []string{annotationContainerdName, annotationRefName} {
		v := ann[k]
		if v == "" || (k == annotationRefName && !strings.ContainsAny(v, "/:@")) {
			continue
		}
		if r, err := s.parseRef(v); err == nil {
			return canonical(r), true
		}
	}
	return "", false
}

// dockerEntries lists the images of a docker archive. Its layers are plain
// tars, read with Uncompressed so that nothing is recompressed.
func (s *Store) dockerEntries(ctx context.Context, a *archive, gz bool, files archiveFiles) ([]importEntry, error) {
	base := a.base
	opener := func() (io.ReadCloser, error) { return s.openArchive(ctx, a, gz) }
	// go-containerregistry reads manifest.json and the configs whole:
	// their sizes in the archive are checked first.
	if err := files.check("manifest.json", "manifest.json", maxManifestSize); err != nil {
		return nil, err
	}
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, err
	}
	var out []importEntry
	for i, d := range m {
		var tag *name.Tag
		if len(d.RepoTags) > 0 {
			t, err := name.NewTag(d.RepoTags[0])
			if err != nil {
				return nil, errdefs.Invalid("it names an image %q, which is not a valid reference", d.RepoTags[0])
			}
			tag = &t
		} else if len(m) > 1 {
			return nil, errdefs.Invalid("image %d of %d has no name; name every image in a multi-image archive", i+1, len(m))
		}
		if err := files.check(d.Config, "config", maxConfigSize); err != nil {
			return nil, err
		}
		img, err := tarball.Image(opener, tag)
		if err != nil {
			return nil, err
		}
		e := importEntry{src: &source{what: base}}
		for _, t := range d.RepoTags {
			r, err := s.parseRef(t)
			if err != nil {
				return nil, err
			}
			e.keys = append(e.keys, canonical(r))
		}
		if len(e.keys) > 0 {
			e.src.what = familiarOf(e.keys[0])
		}
		if e.src.config, err = img.RawConfigFile(); err != nil {
			return nil, err
		}
		layers, err := img.Layers()
		if err != nil {
			return nil, err
		}
		for _, l := range layers {
			diffID, err := l.DiffID()
			if err != nil {
				return nil, err
			}
			e.src.layers = append(e.src.layers, layerSource{id: shortHex(diffID.String()), digest: diffID.String(), open: l.Uncompressed})
		}
		out = append(out, e)
	}
	return out, nil
}

// sniffArchive tells an OCI layout tarball ("oci") from a docker archive
// ("docker"). docker 25+ writes both at once; the OCI layout then wins as
// it carries real manifest digests. For a docker archive it lists the
// archive's files.
func (s *Store) sniffArchive(ctx context.Context, a *archive) (kind string, gz bool, files archiveFiles, err error) {
	f, err := os.Open(a.file)
	if err != nil {
		return "", false, nil, err
	}
	defer f.Close()
	var magic [2]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil {
		return "", false, nil, err
	}
	gz = magic == [2]byte{0x1f, 0x8b}
	rc, err := s.openArchive(ctx, a, gz)
	if err != nil {
		return "", gz, nil, err
	}
	defer rc.Close()
	files = archiveFiles{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return kind, gz, files, nil
		}
		if err != nil {
			return "", gz, nil, err
		}
		name := path.Clean(hdr.Name)
		if _, seen := files[name]; !seen { // go-containerregistry takes the first
			if len(files) >= maxArchiveFiles {
				return "", gz, nil, errdefs.Invalid("cannot import %s: it holds more than %d files, and an image archive holds a few for each layer", a.what, maxArchiveFiles)
			}
			files[name] = archiveFile{typ: hdr.Typeflag, size: hdr.Size, link: hdr.Linkname}
		}
		switch path.Clean(strings.TrimLeft(hdr.Name, "/")) {
		case "oci-layout":
			return "oci", gz, nil, nil
		case "manifest.json":
			kind = "docker"
		}
	}
}

// maxArchiveFiles bounds the entries of an archive's tar (what sniffArchive
// keeps of them is in memory). A docker archive holds a few per layer, an
// OCI layout one per blob.
const maxArchiveFiles = 1 << 16

// archiveFiles are the entries of a docker archive by cleaned name.
type archiveFiles map[string]archiveFile

type archiveFile struct {
	typ  byte
	size int64
	link string
}

// check refuses the file name if it is over limit, following links as
// go-containerregistry's tarball package does (a missing file or a link
// cycle is left for it to report).
func (fs archiveFiles) check(name, doc string, limit int64) error {
	seen := map[string]bool{}
	for p := path.Clean(name); !seen[p]; {
		seen[p] = true
		f, ok := fs[p]
		switch {
		case !ok:
			return nil
		case f.typ == tar.TypeSymlink || f.typ == tar.TypeLink:
			p = path.Join(filepath.Dir(p), path.Clean(f.link))
		case f.size > limit:
			return &errDocTooLarge{doc: doc, limit: limit}
		default:
			return nil
		}
	}
	return nil
}

// extractArchive unpacks an OCI layout tarball with the layer unpacker,
// which already refuses paths that escape the target, within the bound of
// one image.
func (s *Store) extractArchive(ctx context.Context, a *archive, gz bool, dir string) error {
	b := s.newBudget(a.what, true)
	if err := b.checkDisk(); err != nil {
		return err
	}
	rc, err := s.openArchive(ctx, a, gz)
	if err != nil {
		return err
	}
	defer rc.Close()
	r := &budgetReader{r: rc, b: b}
	if _, err = unpackLayer(ctx, r, dir, b, "", func(msg string, args ...any) { s.log.Warn(msg, append(args, "archive", a.file)...) }); err != nil {
		var he *hostErr
		if errors.As(err, &he) {
			return s.storeErr("unpack the archive", he.error)
		}
		if e, ok := errdefs.As(err); ok {
			return e
		}
		return fmt.Errorf("unpack the archive: %w", err)
	}
	return nil
}

// openArchive opens an archive to read its tar, through gzip if gz: a
// read stops when ctx ends, or past the bound of one image uncompressed.
func (s *Store) openArchive(ctx context.Context, a *archive, gz bool) (io.ReadCloser, error) {
	f, err := os.Open(a.file)
	if err != nil {
		return nil, err
	}
	if !gz {
		return struct {
			io.Reader
			io.Closer
		}{ctxReader{ctx, f}, f}, nil
	}
	zr, err := gzip.NewReader(ctxReader{ctx, f})
	if err != nil {
		f.Close()
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{&budgetReader{r: zr, b: s.newBudget(a.what, true)}, closers{zr, f}}, nil
}

type closers []io.Closer

func (c closers) Close() error {
	var errs []error
	for _, x := range c {
		errs = append(errs, x.Close())
	}
	return errors.Join(errs...)
}

// importErr blames the archive for what goes wrong reading it; what the
// store's own disk work fails at (storeErr) stays internal.
func importErr(ctx context.Context, what string, err error) error {
	var dtl *errDocTooLarge
	if errors.As(err, &dtl) {
		return &errdefs.Error{Kind: errdefs.KindTooLarge, Code: codeImageTooLarge, Msg: fmt.Sprintf("cannot import %s: %v, the most this server reads", what, dtl), Err: err}
	}
	if e, ok := errdefs.As(err); ok {
		if e.Kind == errdefs.KindInvalid && !strings.HasPrefix(e.Msg, "cannot import ") {
			return &errdefs.Error{Kind: e.Kind, Code: e.Code, Msg: fmt.Sprintf("cannot import %s: %s", what, e.Msg), Err: err}
		}
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("import %s: %w", what, ctx.Err())
	}
	return &errdefs.Error{Kind: errdefs.KindInvalid, Code: client.CodeInvalidArgument, Msg: fmt.Sprintf("cannot import %s: %v", what, err), Err: err}
}

// pathErr drops the path an *fs.PathError repeats.
func pathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
