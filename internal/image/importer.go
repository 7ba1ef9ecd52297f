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
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/klauspost/compress/gzip"

	"github.com/useshards/shard/internal/errdefs"
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
	a := &archive{file: path, what: path, base: filepath.Base(path)}
	imgs, err := s.importArchive(ctx, a, ref)
	return imgs, s.public(err, a.names())
}

// ImportStream imports an archive read from r (an upload), as Import does
// a file. It is spooled under the store's tmp/, which only root can reach,
// and removed when done (or, after a crash, by the next Open). Messages
// call it "the upload" and never name a host path.
func (s *Store) ImportStream(ctx context.Context, r io.Reader, ref string) ([]*Image, error) {
	f, err := os.CreateTemp(s.path("tmp"), "upload-")
	if err != nil {
		return nil, s.storeErr("keep the upload", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	a := &archive{file: f.Name(), what: "the upload", base: "upload"}
	src := &errReader{r: ctxReader{ctx, r}}
	_, err = io.Copy(f, src)
	if err == nil {
		err = f.Close()
	}
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return nil, fmt.Errorf("import: %w", ctx.Err())
	case src.err != nil:
		return nil, errdefs.Invalid("cannot import the upload: reading it failed: %v", s.public(src.err, a.names()))
	default:
		return nil, s.storeErr("keep the upload", err)
	}
	imgs, err := s.importArchive(ctx, a, ref)
	return imgs, s.public(err, a.names())
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

func (s *Store) importArchive(ctx context.Context, a *archive, ref string) ([]*Image, error) {
	var named name.Reference
	if strings.TrimSpace(ref) != "" {
		r, err := s.parseRef(ref)
		if err != nil {
			return nil, err
		}
		named = r
	}
	entries, cleanup, err := s.readArchive(a)
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
	for _, e := range entries {
		if len(e.keys) == 0 {
			return nil, errdefs.Invalid("cannot import %s: the archive does not name its image; give a name, e.g. \"myimage:latest\"", a.what)
		}
	}
	var out []*Image
	for _, e := range entries {
		in, err := s.install(ctx, e.src, nil)
		if err != nil {
			return nil, importErr(ctx, a.what, err)
		}
		imgs, err := s.commit(e.keys, in)
		s.unpin(in.pins...)
		if err != nil {
			return nil, err
		}
		s.log.Info("imported image", "image", e.src.what, "digest", in.digest)
		out = append(out, imgs...)
	}
	return out, nil
}

// readArchive finds the images in an archive. cleanup removes the temp
// copy of an OCI layout tarball once the images are installed.
func (s *Store) readArchive(a *archive) (entries []importEntry, cleanup func(), err error) {
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
	kind, gz, err := sniffArchive(a.file)
	if err != nil {
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
		if err := s.extractArchive(a.file, gz, tmp); err != nil {
			return nil, cleanup, err
		}
		entries, err = s.layoutEntries(tmp)
		return entries, cleanup, err
	case "docker":
		entries, err = s.dockerEntries(a.file, a.base, gz)
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
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, err
			}
			if e.src.index, err = child.RawManifest(); err != nil {
				return nil, err
			}
			img, err = imageFromIndex(child, e.src.what)
			if err != nil {
				return nil, err
			}
		case d.MediaType.IsImage():
			if img, err = idx.Image(d.Digest); err != nil {
				return nil, err
			}
		default:
			continue // signatures, attestations and other artifacts
		}
		if _, err := imageSource(e.src, img); err != nil {
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
func (s *Store) dockerEntries(file, base string, gz bool) ([]importEntry, error) {
	opener := func() (io.ReadCloser, error) { return openArchive(file, gz) }
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
			e.src.layers = append(e.src.layers, layerSource{id: shortHex(diffID.String()), open: l.Uncompressed})
		}
		out = append(out, e)
	}
	return out, nil
}

// sniffArchive tells an OCI layout tarball ("oci") from a docker archive
// ("docker"). docker 25+ writes both at once; the OCI layout then wins as
// it carries real manifest digests.
func sniffArchive(file string) (kind string, gz bool, err error) {
	f, err := os.Open(file)
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	var magic [2]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil {
		return "", false, err
	}
	gz = magic == [2]byte{0x1f, 0x8b}
	rc, err := openArchive(file, gz)
	if err != nil {
		return "", gz, err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return kind, gz, nil
		}
		if err != nil {
			return "", gz, err
		}
		switch path.Clean(strings.TrimLeft(hdr.Name, "/")) {
		case "oci-layout":
			return "oci", gz, nil
		case "manifest.json":
			kind = "docker"
		}
	}
}

// extractArchive unpacks an OCI layout tarball with the layer unpacker,
// which already refuses paths that escape the target.
func (s *Store) extractArchive(file string, gz bool, dir string) error {
	rc, err := openArchive(file, gz)
	if err != nil {
		return err
	}
	defer rc.Close()
	if _, err = unpackLayer(rc, dir, func(msg string, args ...any) { s.log.Warn(msg, append(args, "archive", file)...) }); err != nil {
		return fmt.Errorf("unpack the archive: %w", err)
	}
	return nil
}

func openArchive(file string, gz bool) (io.ReadCloser, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	if !gz {
		return f, nil
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{zr, closers{zr, f}}, nil
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
	if e, ok := errdefs.As(err); ok {
		if e.Kind == errdefs.KindInvalid && !strings.HasPrefix(e.Msg, "cannot import ") {
			return &errdefs.Error{Kind: e.Kind, Code: e.Code, Msg: fmt.Sprintf("cannot import %s: %s", what, e.Msg), Err: err}
		}
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("import %s: %w", what, ctx.Err())
	}
	return &errdefs.Error{Kind: errdefs.KindInvalid, Code: "invalid_argument", Msg: fmt.Sprintf("cannot import %s: %v", what, err), Err: err}
}

// pathErr drops the path an *fs.PathError repeats.
func pathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
