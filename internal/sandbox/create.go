package sandbox

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/useshards/shard/internal/project"

	"github.com/useshards/shard/internal/envlist"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/image"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/names"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/revert"
	"github.com/useshards/shard/internal/store"
	"github.com/useshards/shard/internal/units"
)

// CreateRequest is what a user asks for.
type CreateRequest struct {
	Name  string
	Image string
	store.Bounds
	Env      []string
	Provider string
	// FromSnapshot starts the sandbox with a snapshot's files (and its
	// image and disk size) instead of empty ones.
	FromSnapshot string
	// Internal: resume makes a sandbox of the very image (Digest) a session
	// started with, and says so in its sandbox.created event.
	Digest      string
	ResumedFrom string
}

// Defaults for what a create leaves out.
const (
	DefaultMemory = 512 << 20
	DefaultCPU    = 1000
	DefaultDisk   = 2 << 30
	DefaultPids   = 4096
	MinMemory     = 32 << 20
	MinDisk       = 16 << 20
)

// validName checks a sandbox name ("" is fine: the id becomes the name);
// snapshots and environments follow the same rule (names.Name).
func validName(name string) error {
	if name == "" {
		return nil
	}
	return names.Name("", name)
}

// validate fills in the bounds a create leaves out and refuses what this
// host cannot honour (CheckCreate), then checks the image and provider.
func (s *Service) validate(req *CreateRequest) error {
	if req.DiskBytes == 0 && s.cfg.DefaultDisk > 0 {
		req.DiskBytes = s.cfg.DefaultDisk
	}
	lim := s.Limits()
	withDefaults(req, lim)
	if err := checkCreate(req, lim); err != nil {
		return err
	}
	if strings.TrimSpace(req.Image) == "" {
		return errdefs.Invalid("an image is required")
	}
	if req.Provider == "" {
		req.Provider = s.cfg.DefaultProvider
	}
	if g, ok := s.providers[req.Provider].(provider.Guest); ok && req.CPUMillis < g.MinCPU() {
		return errdefs.Invalid("cpu %s is too little for %s: at least %s (its kernel runs in user space, and boots in minutes below that); runc takes from %s",
			units.FormatCPU(req.CPUMillis), req.Provider, units.FormatCPU(g.MinCPU()), units.FormatCPU(MinCPU))
	}
	c, ok := s.caps[req.Provider]
	if !ok {
		return errdefs.Invalid("unknown provider %q: shard capabilities lists them", req.Provider)
	}
	if !c.Available {
		return errdefs.Unsupported("provider %s is not available on this host: %s", req.Provider, c.Reason)
	}
	return nil
}

// Create makes and starts a sandbox. On any failure nothing is left behind.
func (s *Service) Create(ctx context.Context, req CreateRequest) (_ *store.Sandbox, err error) {
	defer s.observe("create", time.Now(), &req.Provider, &err)
	snap, err := s.fromSnapshot(ctx, &req)
	if err != nil {
		return nil, err
	}
	if err := s.validate(&req); err != nil {
		return nil, err
	}
	if err := s.adm.ledgerRoom(ctx, project.Of(ctx), "create a sandbox"); err != nil {
		return nil, err
	}
	// What quotas and the host's memory refuse is refused before the
	// store, the image or the network are asked anything.
	if err := s.adm.precheck(ctx, &store.Sandbox{Name: req.Name, Shape: store.Shape{Bounds: req.Bounds}}, 1, "sandbox "+cmp.Or(req.Name, "(unnamed)")); err != nil {
		return nil, err
	}
	// Checked again when the files are made; here so that a create that
	// cannot fit leaves no record and pulls no image.
	if err := s.cfg.Storage.Fits(req.DiskBytes, "a sandbox with a "+units.FormatSize(req.DiskBytes)+" disk"); err != nil {
		return nil, err
	}
	img, err := s.createImage(ctx, req, snap)
	if err != nil {
		return nil, err
	}
	releaseImage, err := s.useImage(ctx, img)
	if err != nil {
		return nil, err
	}
	defer releaseImage() // (once the record names it, below)
	shape := createShape(req, img, snap)
	created := ledger.CreatedOf(shape)
	created.ResumedFrom = req.ResumedFrom
	origin := &store.Origin{Kind: OriginImage, Name: shape.Image}
	if snap != nil {
		created.FromSnapshot = snap.ID
		origin = &store.Origin{Kind: OriginSnapshot, Name: snap.Name, ID: snap.ID}
	}
	if req.ResumedFrom != "" {
		origin = &store.Origin{Kind: OriginSession, Name: req.ResumedFrom}
	}
	recs, err := s.insertRecords(ctx, []*store.Sandbox{{
		Name: req.Name, Shape: shape, Token: newToken(), AgentDir: s.agentDir, Origin: origin,
	}}, func(*store.Sandbox) (string, ledger.CreatedData) { return "", created })
	releaseImage()
	if err != nil {
		return nil, err
	}
	sb := recs[0]
	log := s.cfg.Log.With("sandbox", sb.ID, "name", sb.Name)
	// From here on the record exists: a failure must remove every piece.
	bg := context.WithoutCancel(ctx)
	r := revert.New()
	defer r.Fail()
	r.Add(func() { s.discard(bg, sb, log) })
	if snap != nil {
		err = s.saved.filesFromSnapshot(ctx, snap, sb)
	} else {
		err = s.cfg.Storage.Create(ctx, sb.ID, req.DiskBytes)
	}
	if err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", sb.Name, err)
	}
	if err := s.boot(ctx, sb, img.Layers); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", sb.Name, err)
	}
	out, err := s.move(bg, sb.ID, StateRunning, nil, func(r *store.Sandbox) { r.StartedAt = time.Now().UTC() })
	if err != nil {
		return nil, err
	}
	r.Success()
	log.Info("created", "image", req.Image, "provider", req.Provider, "ip", sb.IP)
	return out, nil
}

// fromSnapshot finds the snapshot a create starts from, if it names one,
// and takes its image and disk size into req (a request that gives other
// ones is refused).
func (s *Service) fromSnapshot(ctx context.Context, req *CreateRequest) (*store.Snapshot, error) {
	if req.FromSnapshot == "" {
		return nil, nil
	}
	snap, err := s.cfg.Store.GetSnapshot(ctx, req.FromSnapshot)
	if err != nil {
		return nil, err
	}
	if req.Image == "" {
		req.Image = snap.Image
	} else if req.Image != snap.Image && req.Image != snap.ImageDigest {
		return nil, errdefs.Invalid("snapshot %s holds files over image %s: leave the image out, or give that one", snap.Name, snap.Image)
	}
	if req.DiskBytes != 0 && req.DiskBytes != snap.DiskBytes {
		return nil, errdefs.Invalid("snapshot %s has a disk of %d bytes: a sandbox from it has that size (leave --disk out)", snap.Name, snap.DiskBytes)
	}
	req.DiskBytes = snap.DiskBytes
	return snap, nil
}

// createImage is the image a create starts from: a snapshot's files sit
// over the very image they were made on (whatever its tag names today), a
// resume asks for the digest its session began with, and anything else is
// pulled if it is not here.
func (s *Service) createImage(ctx context.Context, req CreateRequest, snap *store.Snapshot) (*image.Image, error) {
	switch {
	case snap != nil:
		img, err := s.cfg.Images.Get(ctx, snap.ImageDigest)
		if err != nil {
			return nil, fmt.Errorf("image %s of snapshot %s: %w", snap.Image, snap.Name, err)
		}
		return img, nil
	case req.Digest != "":
		img, err := s.cfg.Images.Get(ctx, req.Digest)
		if err != nil {
			return nil, fmt.Errorf("image %s (%s): %w", req.Image, req.Digest, err)
		}
		return img, nil
	}
	return s.cfg.Images.Ensure(ctx, req.Image, nil)
}

// createShape is the shape of a new sandbox: the request's image and
// bounds, and the image's environment (or the snapshot's) under the
// request's, with a PATH.
func createShape(req CreateRequest, img *image.Image, snap *store.Snapshot) store.Shape {
	env := envlist.Merge(img.Config.Env, req.Env)
	if snap != nil {
		env = envlist.Merge(snap.Env, req.Env)
	}
	if !envlist.Has(env, "PATH") {
		env = append(env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	return store.Shape{Image: req.Image, ImageDigest: img.Digest, Provider: req.Provider, Bounds: req.Bounds, Env: env}
}
