package sandbox

import (
	"context"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/image"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/store"
)

// A removal waits for a create that holds the image, and then sees its
// record: it never removes an image from under a sandbox being made.
func TestRemoveImageWaitsForCreate(t *testing.T) {
	f := newFakeService(t)
	ctx := project.Unscoped(context.Background(), "a test")
	img := &image.Image{Name: fakeImage, Digest: fakeImage}
	if err := f.svc.RemoveImage(ctx, fakeImage, img, true, nil); err != nil {
		t.Fatalf("RemoveImage with no sandbox: %v", err)
	}
	// A create between finding its image and writing its record.
	release, err := f.svc.useImage(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	removed := make(chan error, 1)
	go func() { removed <- f.svc.RemoveImage(ctx, fakeImage, img, true, nil) }()
	select {
	case err := <-removed:
		t.Fatalf("RemoveImage returned %v while a create held the image", err)
	case <-time.After(50 * time.Millisecond):
	}
	// Its record, written while the removal waits (as Create writes it
	// before letting go of the image).
	rec := &store.Sandbox{ID: "u1", Name: "uses-it", State: StateCreating}
	rec.ImageDigest = fakeImage
	if err := f.st.CreateSandbox(ctx, rec, nil); err != nil {
		t.Fatal(err)
	}
	release()
	if err := <-removed; errdefs.CodeOf(err) != client.CodeImageInUse {
		t.Fatalf("RemoveImage after the create = %v, want image_in_use", err)
	}
}
