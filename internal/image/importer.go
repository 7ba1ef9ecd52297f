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

// Import loads the images in path: an OCI image layout directory, a
// tarball of one, or a docker-archive tarball (`docker save`); tarballs
// may be gzipped. ref, if given, becomes the image's only reference; it
// is required when the archive names no image and refused when it holds
// several.
func (s *Store) Import(ctx context.Context, path string, ref string) ([]*Image, error) {
	var named name.Reference
	if strings.TrimSpace(ref) != "" {
		r, err := s.parseRef(ref)
		if err != nil {
			return nil, err
		}
		named = r
	}
	entries, cleanup, err := s.readArchive(path)
	defer cleanup()
	if err != nil {
		return nil, importErr(ctx, path, err)
	}
	switch {
	case len(entries) == 0:
		return nil, errdefs.Invalid("cannot import %s: it holds no linux/%s image", path, runtime.GOARCH)
	case named != nil && len(entries) > 1:
		return nil, errdefs.Invalid("cannot import %s: it holds %d images, and a name can only be given to a single image", path, len(entries))
	case named != nil:
		entries[0].keys = []string{canonical(named)}
		entries[0].src.what = familiar(named)
	}
	for _, e := range entries {
		if len(e.keys) == 0 {
			return nil, errdefs.Invalid("cannot import %s: the archive does not name its image; give a name, e.g. \"myimage:latest\"", path)
		}
	}
	var out []*Image
	for _, e := range entries {
		in, err := s.install(ctx, e.src, nil)
		if err != nil {
			return nil, importErr(ctx, path, err)
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

// readArchive finds the images in path. cleanup removes the temp copy of
// an OCI layout tarball once the images are installed.
func (s *Store) readArchive(path string) (entries []importEntry, cleanup func(), err error) {
	cleanup = func() {}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, cleanup, errdefs.Invalid("cannot import %s: %v", path, pathErr(err))
	}
	if fi.IsDir() {
		if _, err := os.Stat(filepath.Join(path, "oci-layout")); err != nil {
			return nil, cleanup, errdefs.Invalid("cannot import %s: a directory must be an OCI image layout (it has no oci-layout file)", path)
		}
		entries, err = s.layoutEntries(path)
		return entries, cleanup, err
	}
	kind, gz, err := sniffArchive(path)
	if err != nil {
		return nil, cleanup, errdefs.Invalid("cannot import %s: not a readable tar archive: %v", path, err)
	}
	switch kind {
	case "oci":
		tmp, err := os.MkdirTemp(s.path("tmp"), "import-")
		if err != nil {
			return nil, cleanup, err
		}
		cleanup = func() { _ = os.RemoveAll(tmp) }
		if err := s.extractArchive(path, gz, tmp); err != nil {
			return nil, cleanup, err
		}
		entries, err = s.layoutEntries(tmp)
		return entries, cleanup, err
	case "docker":
		entries, err = s.dockerEntries(path, gz)
		return entries, cleanup, err
	}
	return nil, cleanup, errdefs.Invalid("cannot import %s: it is neither an OCI image layout nor a docker archive (docker save)", path)
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
func (s *Store) dockerEntries(file string, gz bool) ([]importEntry, error) {
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
				return nil, errdefs.Invalid("cannot import %s: it names an image %q, which is not a valid reference", file, d.RepoTags[0])
			}
			tag = &t
		} else if len(m) > 1 {
			return nil, errdefs.Invalid("cannot import %s: image %d of %d has no name; name every image in a multi-image archive", file, i+1, len(m))
		}
		img, err := tarball.Image(opener, tag)
		if err != nil {
			return nil, err
		}
		e := importEntry{src: &source{what: filepath.Base(file)}}
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
	_, err = unpackLayer(rc, dir, func(msg string, args ...any) { s.log.Warn(msg, append(args, "archive", file)...) })
	return err
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

// importErr blames the archive for what goes wrong reading it.
func importErr(ctx context.Context, path string, err error) error {
	if _, ok := errdefs.As(err); ok {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("import %s: %w", path, ctx.Err())
	}
	return &errdefs.Error{Kind: errdefs.KindInvalid, Code: "invalid_argument", Msg: fmt.Sprintf("cannot import %s: %v", path, err), Err: err}
}

// pathErr drops the path an *fs.PathError repeats.
func pathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
