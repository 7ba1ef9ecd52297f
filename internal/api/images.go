package api

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/useshards/shard/internal/cluster"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/image"
	"github.com/useshards/shard/internal/project"
)

func imageView(i *image.Image) Image {
	return Image{Name: i.Name, Ref: i.Ref, Project: i.Project, Digest: i.Digest, Size: i.Size, Layers: len(i.Layers), Created: i.Created, Origin: i.Origin}
}

func (s *Server) listImages(r *http.Request) (any, int, error) {
	all, err := s.Images.List(r.Context())
	if err != nil {
		return nil, 0, err
	}
	out := make([]Image, 0, len(all))
	for _, i := range all {
		out = append(out, imageView(i))
	}
	return map[string]any{"images": out}, 200, nil
}

func (s *Server) getImage(r *http.Request) (any, int, error) {
	i, err := s.Images.Get(r.Context(), r.PathValue("ref"))
	if err != nil {
		return nil, 0, err
	}
	return imageView(i), 200, nil
}

func (s *Server) removeImage(r *http.Request) (any, int, error) {
	ref := r.PathValue("ref")
	img, err := s.Images.Get(r.Context(), ref)
	if err != nil {
		return nil, 0, err
	}
	if img.Project == "" && !isAdmin(r.Context()) {
		return nil, 0, errdefs.New(errdefs.KindForbidden, "image_shared",
			"cannot remove image %q: it was pulled from a registry and every project shares it; only an admin key may remove it", img.Name)
	}
	// Every project's sandboxes may use a shared image: all are asked,
	// and another project's is not named.
	sbs, err := s.Sandboxes.List(project.Unscoped(r.Context(), "an image's users, of every project"))
	if err != nil {
		return nil, 0, err
	}
	own, _ := project.From(r.Context())
	for _, sb := range sbs {
		if sb.ImageDigest != img.Digest {
			continue
		}
		if sb.Project == own {
			return nil, 0, errdefs.Conflict("image_in_use", "image %s is used by sandbox %s: remove the sandbox first", ref, sb.Name)
		}
		return nil, 0, errdefs.Conflict("image_in_use", "image %s is used by a sandbox of another project", ref)
	}
	// In a cluster an import goes from every node: the copies other nodes
	// made on first use first.
	if s.Cluster != nil && img.Project != "" && img.Origin == "" {
		if err := s.dropCopies(r, img); err != nil {
			return nil, 0, err
		}
	}
	if err := s.Images.Remove(r.Context(), ref, isAdmin(r.Context())); err != nil {
		return nil, 0, err
	}
	return map[string]string{"removed": ref}, 200, nil
}

// pullImage streams progress as NDJSON. A malformed body, a bad reference
// and a registry this server does not pull from (403) are plain 4xx
// answers, before anything is connected; every error of the pull itself is
// the stream's last line, {"type":"error","error":{code,message}}.
func (s *Server) pullImage(w http.ResponseWriter, r *http.Request) {
	var req PullRequest
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Image == "" {
		s.writeError(w, r, errdefs.Invalid("an image is required"))
		return
	}
	if err := s.Images.CheckPull(r.Context(), req.Image); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	var mu sync.Mutex
	enc := json.NewEncoder(w)
	last := time.Time{}
	img, err := s.Images.Pull(r.Context(), req.Image, func(p image.Progress) {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(last) < 100*time.Millisecond && p.Done < p.Total {
			return
		}
		last = time.Now()
		enc.Encode(PullEvent{Type: "progress", Layer: p.Layer, Status: p.Status, Total: p.Total, Done: p.Done})
		rc.Flush()
	})
	mu.Lock()
	defer mu.Unlock()
	if err != nil {
		enc.Encode(PullEvent{Type: "error", Error: &Error{Code: errdefs.CodeOf(err), Message: err.Error()}})
		return
	}
	v := imageView(img)
	enc.Encode(PullEvent{Type: "done", Image: &v})
}

// importImage takes an OCI layout tarball or a docker-archive as the body
// (the store spools it under its own dir, up to its bound of one image).
// A body that says it is over the bound is refused before it is read.
func (s *Server) importImage(r *http.Request) (any, int, error) {
	name, err := importName(r)
	if err != nil {
		return nil, 0, err
	}
	if name != "" {
		if err := s.Images.CheckImportName(name); err != nil {
			return nil, 0, err
		}
		// A name another node's import holds is refused before the upload
		// is read (and, in a race, when the import is recorded).
		if canon, ok := image.ImportName(name); ok && s.Cluster != nil {
			if p, err := s.Cluster.Image(r.Context(), canon); err == nil && p.Node != s.Cluster.Name() {
				return nil, 0, cluster.ImageTaken(canon, p.Node)
			}
		}
	}
	if r.ContentLength > s.Images.MaxImageSize() {
		return nil, 0, s.Images.UploadTooLarge("the upload")
	}
	imgs, err := s.Images.ImportStream(r.Context(), r.Body, name)
	if err != nil {
		return nil, 0, err
	}
	out := make([]Image, 0, len(imgs))
	for _, i := range imgs {
		out = append(out, imageView(i))
	}
	return map[string]any{"images": out}, http.StatusCreated, nil
}
