package crossnode

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/image"
	"github.com/useshards/shard/internal/project"
)

// EnsureImport makes sure this node holds the import ref (of ctx's
// project) before a create from it: imported here, or a copy of what etcd
// records for it, made on the first use here (the node that imported it
// sends it, and image.Store.ImportCopy checks it against the digest etcd
// records) and kept while etcd records the same digest. A copy of an
// import that is gone is dropped (unless a sandbox uses it) and not used.
// With etcd away a copy is used as it is. Any other image is left to the
// create (pulled if it is not here).
func (s *Service) EnsureImport(ctx context.Context, ref string) error {
	canon, ok := image.ImportName(ref)
	if !ok {
		return nil
	}
	defer s.importLocks.Lock(project.Of(ctx) + " " + canon)()
	local, lerr := s.Images.Get(ctx, ref)
	switch {
	case lerr == nil && local.Origin == "":
		return nil // imported here
	case lerr != nil && !errdefs.Is(lerr, errdefs.KindNotFound):
		return lerr
	case lerr != nil:
		local = nil
	}
	p, perr := s.Records.Image(ctx, canon)
	switch {
	case perr == nil && local != nil && p.Digest == local.Digest:
		return nil // a copy of what the cluster records
	case perr != nil && !errdefs.Is(perr, errdefs.KindNotFound):
		if local != nil {
			return nil // etcd away: the copy is what there is
		}
		return perr
	case perr != nil && local != nil:
		// Removed where it was imported: this copy goes too.
		if err := s.dropCopy(ctx, local); err != nil {
			s.Log.Warn("cluster: a copy of a removed image stays while it is used", "image", local.Ref, "err", err)
		}
		return errdefs.NotFound(client.CodeImageNotFound, "image %s is no longer in project %s: the node that imported it removed it", ref, project.Of(ctx))
	case perr != nil:
		return nil // unknown: the create says so
	case p.Node == s.Records.Name():
		return nil // recorded as this node's, but not here: the create says so
	}
	holder, err := s.Peers.Up(ctx, p.Node)
	if err != nil {
		return fmt.Errorf("image %s was imported on node %s: %w", ref, p.Node, err)
	}
	start := time.Now()
	n, err := s.copyImport(ctx, holder, canon, p.Digest)
	if err != nil {
		return fmt.Errorf("image %s: copy from node %s: %w", ref, holder.Name(), err)
	}
	s.Log.Info("image copied here on first use", "image", canon, "project", project.Of(ctx), "from", holder.Name(), "digest", p.Digest,
		"bytes", n, "took", time.Since(start))
	return nil
}

// dropCopy removes a copy of another node's import, unless a sandbox here
// uses it.
func (s *Service) dropCopy(ctx context.Context, img *image.Image) error {
	sbs, err := s.Sandboxes.List(project.Unscoped(ctx, "an image copy's users, of every project"))
	if err != nil {
		return err
	}
	for _, sb := range sbs {
		if sb.ImageDigest == img.Digest {
			return errdefs.Conflict(client.CodeImageInUse, "image %s is used by sandbox %s", img.Ref, sb.ID)
		}
	}
	return s.Images.Remove(ctx, img.Ref, false)
}

// copyImport asks node for its import ref and keeps what it sends as a
// copy, checked against digest (ImportCopy keeps nothing of a copy that
// fails); it returns the bytes received.
func (s *Service) copyImport(ctx context.Context, node Origin, ref, digest string) (int64, error) {
	var n int64
	err := node.FetchImport(ctx, ref, func(r io.Reader) error {
		counted := &countingReader{r: r}
		_, err := s.Images.ImportCopy(ctx, counted, ref, digest, node.Name())
		n = counted.n
		return err
	})
	return n, err
}
