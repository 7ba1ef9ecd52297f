package sandbox

import (
	"context"
	"fmt"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/image"
	"github.com/useshards/shard/internal/project"
)

// An image's digest is held (read) by a create or restore from when it
// finds the image until its record names it, and (write) by a removal
// while it checks that no sandbox uses the image and removes it: a removal
// never takes an image from under a sandbox being made of it.

// useImage holds img against removal until release; it fails if img was
// removed before the hold.
func (s *Service) useImage(ctx context.Context, img *image.Image) (release func(), err error) {
	release = s.imageUse.RLock(img.Digest)
	if _, err := s.cfg.Images.Get(ctx, img.Digest); err != nil {
		release()
		return nil, fmt.Errorf("image %s was removed meanwhile: %w", img.Name, err)
	}
	return release, nil
}

// RemoveImage removes image ref (img, which the caller found and may
// remove) unless a sandbox of any project uses it; another project's
// sandbox is not named. prepare, if given, runs first under the same hold
// (a cluster drops the copies its other nodes made).
func (s *Service) RemoveImage(ctx context.Context, ref string, img *image.Image, force bool, prepare func() error) error {
	defer s.imageUse.Lock(img.Digest)()
	sbs, err := s.cfg.Store.ListSandboxes(project.Unscoped(ctx, "an image's users, of every project"))
	if err != nil {
		return err
	}
	own, _ := project.From(ctx)
	for _, sb := range sbs {
		if sb.ImageDigest != img.Digest {
			continue
		}
		if sb.Project == own {
			return errdefs.Conflict(client.CodeImageInUse, "image %s is used by sandbox %s: remove the sandbox first", ref, sb.Name)
		}
		return errdefs.Conflict(client.CodeImageInUse, "image %s is used by a sandbox of another project", ref)
	}
	if prepare != nil {
		if err := prepare(); err != nil {
			return err
		}
	}
	return s.cfg.Images.Remove(ctx, ref, force)
}
