package image

import (
	"context"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
)

// Imported images belong to the project that imported them and are named
// under localRegistry ("localhost/NAME[:TAG]", podman's convention for
// images made on this host), a registry pulls never reach: an import can
// never stand for a registry's image ("python:3.12-slim" always means
// docker.io's), nor for another project's import.
//
// In the index an import's key is its project, a space, and its canonical
// reference ("team-a localhost/app:1"); a pulled image's key is its
// canonical reference alone, shared by every project (a cache).
const localRegistry = "localhost"

// ImportRule says how imported images are named, for messages.
const ImportRule = "an imported image is named localhost/NAME[:TAG] (e.g. localhost/myapp:1), so that it never stands for a registry's image; it belongs to the project that imports it"

// isLocal reports whether r names an imported image.
func isLocal(r name.Reference) bool { return r.Context().RegistryStr() == localRegistry }

// importKey is the index key of an import of project p.
func importKey(p, canon string) string { return p + " " + canon }

// splitKey splits an index key into its project ("" for a pulled image)
// and its canonical reference.
func splitKey(k string) (proj, canon string) {
	if p, c, ok := strings.Cut(k, " "); ok {
		return p, c
	}
	return "", k
}

// visible reports whether the index key k may be seen under ctx: a pulled
// image always, an import in its own project (or unscoped, by the
// server's own work).
func visible(ctx context.Context, k string) bool {
	p, _ := splitKey(k)
	return p == "" || project.Visible(ctx, p)
}

// localName is where an archive's own name for an image puts it:
// "docker.io/library/python:3.12-slim" becomes localhost/python:3.12-slim,
// "ghcr.io/org/app:1" localhost/org/app:1.
func localName(r name.Reference) (name.Reference, error) {
	repo := r.Context().RepositoryStr()
	if registryName(r) == dockerHub {
		if short, ok := strings.CutPrefix(repo, "library/"); ok {
			repo = short
		}
	}
	return name.ParseReference(localRegistry + "/" + repo + refSep(r) + r.Identifier())
}

// importRef checks the name an import is given: only localhost/ names.
func (s *Store) importRef(ref string) (name.Reference, error) {
	r, err := s.parseRef(ref)
	if err != nil {
		return nil, err
	}
	if !isLocal(r) {
		suggest := ""
		if l, err := localName(r); err == nil {
			suggest = "; give e.g. " + familiar(l)
		}
		return nil, errdefs.Invalid("cannot import as %q: it names an image of registry %s, which an import may not take: %s%s",
			ref, registryName(r), ImportRule, suggest)
	}
	return r, nil
}

// localizeKeys moves the names an archive gives its images under
// localhost/ in ctx's project.
func localizeKeys(ctx context.Context, keys []string) ([]string, error) {
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		r, err := name.ParseReference(k)
		if err != nil {
			return nil, err
		}
		if !isLocal(r) {
			if r, err = localName(r); err != nil {
				return nil, errdefs.Invalid("the archive names an image %q that cannot be named under localhost/: %v", k, err)
			}
		}
		out = append(out, importKey(project.Of(ctx), canonical(r)))
	}
	return out, nil
}

// CheckImportName refuses, before an upload is read, a name an import may
// not take (400, with the rule).
func (s *Store) CheckImportName(ref string) error {
	_, err := s.importRef(ref)
	return err
}
