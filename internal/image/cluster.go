package image

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
)

// In a cluster an import is its project's on every node: the node that
// imported it tells the cluster (Registry) its name and digest, and keeps
// the layer blobs the archive gave; another node that needs it gets it
// from that node as an OCI image layout (Export), checks every blob of it
// against its digest and the layout against the digest the cluster
// recorded, and keeps it as a copy (ImportCopy, Image.Origin).

// Registry is told of every import made here (never of a copy of another
// node's) and of its removal: a cluster keeps an import's name its
// project's alone across its nodes, and knows which node holds it.
// ClaimImport refuses a name another node's import holds (name_taken), or
// fails when the cluster cannot be reached: then nothing is imported.
type Registry interface {
	ClaimImport(ctx context.Context, project, ref, digest string) error
	// ReleaseImport forgets the import, if this node holds it; a cluster
	// that cannot be reached puts it right when the node reconciles.
	ReleaseImport(ctx context.Context, project, ref string)
}

// SetRegistry makes reg the store's registry (before the store is used).
func (s *Store) SetRegistry(reg Registry) { s.reg = reg }

// ImportName is the canonical name of ref ("localhost/app:latest" for
// "localhost/app") when ref names an import by tag, as a cluster records
// it; ok is false for any other reference.
func ImportName(ref string) (canon string, ok bool) {
	r, err := name.ParseReference(strings.TrimSpace(ref))
	if err != nil || !isLocal(r) {
		return "", false
	}
	if _, isDigest := r.(name.Digest); isDigest {
		return "", false
	}
	return canonical(r), true
}

// claim tells the registry that keys (imports made here) now name digest.
// undo puts back what the registry held for them before.
func (s *Store) claim(ctx context.Context, keys []string, digest string) (undo func(), err error) {
	var done []func()
	undo = func() {
		for i := len(done) - 1; i >= 0; i-- {
			done[i]()
		}
	}
	if s.reg == nil {
		return undo, nil
	}
	bg := context.WithoutCancel(ctx)
	for _, k := range keys {
		p, canon := splitKey(k)
		s.mu.Lock()
		var before *refRecord
		if rr := s.idx.Refs[k]; rr != nil && rr.Origin == "" {
			cp := *rr
			before = &cp
		}
		s.mu.Unlock()
		if err := s.reg.ClaimImport(ctx, p, canon, digest); err != nil {
			undo()
			return nil, err
		}
		if before != nil {
			done = append(done, func() { s.reg.ClaimImport(bg, p, canon, before.Digest) })
		} else {
			done = append(done, func() { s.reg.ReleaseImport(bg, p, canon) })
		}
	}
	return undo, nil
}

// keepBlobs stores the layer blobs of an import (in a cluster) as its
// archive gives them (a docker archive's plain tars, by diffID, as its
// synthesized manifest names them), so that Export sends the very image
// imported. A layer whose digest is not sha256 keeps none: such an import
// stays on its node.
func (s *Store) keepBlobs(ctx context.Context, src *source, in *installed) error {
	var blobs []string
	for _, ls := range src.layers {
		if !strings.HasPrefix(ls.digest, "sha256:") || !hex64.MatchString(trimAlgo(ls.digest)) {
			return nil
		}
		blobs = append(blobs, ls.digest)
	}
	s.mu.Lock()
	s.pinLocked(blobs...)
	s.mu.Unlock()
	in.pins = append(in.pins, blobs...)
	seen := map[string]bool{}
	for _, ls := range src.layers {
		if seen[ls.digest] {
			continue
		}
		seen[ls.digest] = true
		if _, err := os.Stat(s.blobPath(ls.digest)); err == nil {
			continue
		}
		if err := s.keepBlob(ctx, src.what, ls); err != nil {
			return err
		}
	}
	in.rec.Blobs = blobs
	return nil
}

// keepBlob copies one layer blob into blobs/, checked against its digest.
func (s *Store) keepBlob(ctx context.Context, what string, ls layerSource) error {
	if err := s.checkDisk(fmt.Sprintf("image %q", what)); err != nil {
		return err
	}
	rc, err := ls.open()
	if err != nil {
		return fmt.Errorf("layer %s: %w", ls.digest, err)
	}
	defer rc.Close()
	f, err := os.CreateTemp(s.path("tmp"), "blob-")
	if err != nil {
		return s.storeErr("keep a layer", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(ctxReader{ctx, rc}, s.maxImage+1))
	switch {
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		return fmt.Errorf("layer %s: %w", ls.digest, err)
	case n > s.maxImage:
		return s.UploadTooLarge(fmt.Sprintf("image %q", what))
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != ls.digest {
		return invalidImage(nil, "layer %s of image %q does not match its digest (its content is %s)", ls.digest, what, got)
	}
	if err := f.Close(); err != nil {
		return s.storeErr("keep a layer", err)
	}
	if err := os.Rename(f.Name(), s.blobPath(ls.digest)); err != nil {
		return s.storeErr("keep a layer", err)
	}
	return nil
}

// Export writes the import ref (of ctx's project) as a tar of an OCI image
// layout: the blobs it was imported from, and an index naming its digest.
// An import made while the store kept no layer blobs (no registry set),
// and a copy, cannot be exported (image_not_exportable).
func (s *Store) Export(ctx context.Context, ref string, w io.Writer) error {
	if err := project.Require(ctx); err != nil {
		return err
	}
	rr, canon, blobs, err := s.exportable(ctx, ref)
	if err != nil {
		return err
	}
	defer s.unpin(blobs...)
	return s.writeLayout(ctx, w, rr, canon, blobs)
}

// exportable finds import ref's blobs and pins them (the caller unpins),
// or says why it cannot be exported.
func (s *Store) exportable(ctx context.Context, ref string) (rr *refRecord, canon string, blobs []string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys, err := s.resolveLocked(ctx, ref)
	if err != nil {
		return nil, "", nil, err
	}
	key := keys[0]
	proj, canon := splitKey(key)
	rr = s.idx.Refs[key]
	im := s.idx.Images[rr.Manifest]
	switch {
	case proj == "":
		return nil, "", nil, errdefs.Invalid("image %s was pulled from a registry: every node pulls it there, and only an import is sent between nodes", familiarOf(key))
	case im == nil:
		return nil, "", nil, errdefs.NotFound(client.CodeImageNotFound, "image %q is incomplete locally", familiarOf(key))
	case len(im.Layers) > 0 && len(im.Blobs) == 0:
		what := "was imported while this server kept no layers of its imports (outside a cluster, or by an older version)"
		if rr.Origin != "" {
			what = "is a copy of node " + rr.Origin + "'s"
		}
		return nil, "", nil, errdefs.Conflict(client.CodeImageNotExportable, "image %s %s: import it again to use it on the cluster's other nodes", familiarOf(key), what)
	}
	blobs = []string{rr.Digest}
	for _, b := range append([]string{rr.Manifest, im.Config}, im.Blobs...) {
		if !contains(blobs, b) {
			blobs = append(blobs, b)
		}
	}
	s.pinLocked(blobs...) // GC keeps them while they are read
	return rr, canon, blobs, nil
}

// writeLayout writes the OCI layout of an import: its blobs, and an index
// naming rr's digest as canon.
func (s *Store) writeLayout(ctx context.Context, w io.Writer, rr *refRecord, canon string, blobs []string) error {
	top, err := os.ReadFile(s.blobPath(rr.Digest))
	if err != nil {
		return s.storeErr("read an image's manifest", err)
	}
	var doc struct {
		MediaType types.MediaType `json:"mediaType"`
	}
	json.Unmarshal(top, &doc)
	if doc.MediaType == "" {
		doc.MediaType = types.OCIManifestSchema1
		if rr.Digest != rr.Manifest {
			doc.MediaType = types.OCIImageIndex
		}
	}
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     types.OCIImageIndex,
		"manifests": []map[string]any{{
			"mediaType": doc.MediaType, "digest": rr.Digest, "size": len(top),
			"annotations": map[string]string{annotationRefName: canon},
		}},
	})
	tw := tar.NewWriter(w)
	file := func(name string, size int64, r io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size}); err != nil {
			return err
		}
		_, err := io.Copy(tw, ctxReader{ctx, r})
		return err
	}
	layout := `{"imageLayoutVersion":"1.0.0"}`
	if err := file("oci-layout", int64(len(layout)), strings.NewReader(layout)); err != nil {
		return err
	}
	if err := file("index.json", int64(len(index)), strings.NewReader(string(index))); err != nil {
		return err
	}
	for _, b := range blobs {
		f, err := os.Open(s.blobPath(b))
		if err != nil {
			return s.storeErr("read an image's blob", err)
		}
		fi, err := f.Stat()
		if err == nil {
			err = file("blobs/sha256/"+trimAlgo(b), fi.Size(), f)
		}
		f.Close()
		if err != nil {
			return err
		}
	}
	return tw.Close()
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// copyOf makes an import a copy of another node's: the layout it sent must
// name digest, and its every blob must be what its name says.
type copyOf struct {
	digest string // what the cluster records for the import
	origin string // the node that sent it
}

// ImportCopy imports r, an OCI image layout tar node origin sent (its
// Export of the import ref of ctx's project), as a copy of that import,
// checked against digest, the one the cluster records for it: the layout
// must name that digest and nothing else, and every blob in it must hash
// to its name (so the manifest, its config and its layers are the ones the
// digest names; the layers' content is checked against the config's
// diffIDs as they are unpacked). A copy that does not match is refused
// (image_copy_mismatch) and leaves nothing.
func (s *Store) ImportCopy(ctx context.Context, r io.Reader, ref, digest, origin string) (*Image, error) {
	if err := project.Require(ctx); err != nil { // before the copy is read
		return nil, err
	}
	a, done, err := s.spool(ctx, r, fmt.Sprintf("the copy of %s from node %s", ref, origin), "copy")
	defer done()
	if err != nil {
		return nil, err
	}
	imgs, err := s.importArchive(ctx, a, ref, &copyOf{digest: digest, origin: origin})
	if err != nil {
		return nil, s.public(err, a.names())
	}
	if len(imgs) != 1 || imgs[0].Digest != digest {
		return nil, errdefs.New(errdefs.KindFailed, client.CodeImageCopyMismatch, "the copy of %s from node %s was imported as another image than the cluster records (%s)", ref, origin, digest)
	}
	return imgs[0], nil
}

func (c *copyOf) mismatch(a *archive, format string, args ...any) error {
	return errdefs.New(errdefs.KindFailed, client.CodeImageCopyMismatch, "%s does not match the image the cluster records (%s): %s",
		a.what, c.digest, fmt.Sprintf(format, args...))
}

// check checks the layout a copy came as, before anything of it is
// installed.
func (c *copyOf) check(a *archive, entries []importEntry) error {
	if a.tmp == "" {
		return c.mismatch(a, "it is not an OCI image layout")
	}
	if len(entries) != 1 || entries[0].src.digest != c.digest {
		got := make([]string, 0, len(entries))
		for _, e := range entries {
			got = append(got, e.src.digest)
		}
		return c.mismatch(a, "it names %s", strings.Join(got, ", "))
	}
	root := filepath.Join(a.tmp, "blobs")
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case d.IsDir():
			if rel != "." && rel != "sha256" {
				return c.mismatch(a, "it holds blobs of another algorithm than sha256 (%s)", rel)
			}
			return nil
		case !d.Type().IsRegular():
			return c.mismatch(a, "blob %s is not a file", rel)
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return err
		}
		if got := hex.EncodeToString(h.Sum(nil)); "sha256/"+got != filepath.ToSlash(rel) {
			return c.mismatch(a, "blob %s holds other content (sha256:%s)", filepath.ToSlash(rel), got)
		}
		return nil
	})
}
