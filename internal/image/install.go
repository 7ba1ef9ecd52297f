package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"runtime"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sync/errgroup"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/units"
)

// parallelLayers is how many layers download at once, as docker does.
const parallelLayers = 3

// source is an image to install, from a registry or an archive.
type source struct {
	what     string        // the image's name for messages
	digest   string        // what the reference resolved to, if not the manifest (an index)
	index    []byte        // that index, kept as a blob
	manifest []byte        // nil for docker archives: synthesized after unpacking
	config   []byte        // raw config
	layers   []layerSource // bottom first
}

// installed is an image whose layers and blobs are in place, pinned
// against GC until the caller has committed references to it.
type installed struct {
	digest   string // what references point at
	manifest string
	rec      *imageRecord
	pins     []string
	origin   string // the node a copy came from (refRecord.Origin)
}

// install unpacks the layers an image lacks and stores its blobs. On
// success the caller must commit and then unpin in.pins.
func (s *Store) install(ctx context.Context, src *source, rep *reporter) (*installed, error) {
	cfg, err := s.readConfig(src)
	if err != nil {
		return nil, err
	}
	in := &installed{digest: src.digest, rec: &imageRecord{Config: digestOf(src.config), Spec: configOf(cfg)}}
	unique := map[string]layerSource{}
	var order []string
	for i := range src.layers {
		d := cfg.RootFS.DiffIDs[i].String()
		src.layers[i].diffID = d
		in.rec.Layers = append(in.rec.Layers, d)
		if _, dup := unique[d]; !dup {
			unique[d] = src.layers[i]
			order = append(order, d)
		}
	}
	if len(order) > maxLayers {
		return nil, invalidImage(nil, "image %q has %d layers; at most %d can be stacked", src.what, len(order), maxLayers)
	}
	if src.manifest != nil {
		in.manifest = digestOf(src.manifest)
	}
	in.pins = append(append(in.pins, order...), in.rec.Config, in.manifest, in.digest)
	// The image's budget: cached layers count at once, the others as they
	// unpack.
	b := s.newBudget(fmt.Sprintf("image %q", src.what), false)
	s.mu.Lock()
	s.pinLocked(in.pins...)
	need := map[string]bool{}
	var over error
	for _, d := range order {
		need[d] = !s.haveLayerLocked(d)
		if !need[d] && over == nil {
			over = b.cached(s.idx.Layers[d], unique[d].digest)
		}
	}
	s.mu.Unlock()
	ok := false
	defer func() {
		if !ok {
			s.unpin(in.pins...)
			s.dropUnused()
		}
	}()
	if over != nil {
		return nil, over
	}

	for _, d := range order {
		if ls := unique[d]; need[d] {
			rep.add(ls.size, 0)
		} else {
			rep.send(Progress{Layer: ls.id, Status: StatusExists, LayerTotal: ls.size, LayerDone: ls.size})
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(parallelLayers)
	for _, d := range order {
		if need[d] {
			ls := unique[d]
			g.Go(func() error { return s.ensureLayer(gctx, ls, rep, b) })
		}
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if err := s.writeBlobs(src, in); err != nil {
		return nil, err
	}
	ok = true
	return in, nil
}

// readConfig reads and checks src's config: bounded, a Linux image, one
// diffID per layer.
func (s *Store) readConfig(src *source) (*v1.ConfigFile, error) {
	if len(src.config) > maxConfigSize {
		return nil, &errdefs.Error{Kind: errdefs.KindTooLarge, Code: codeImageTooLarge,
			Msg: fmt.Sprintf("image %q is too large: its config is larger than %s, the most this server reads", src.what, units.FormatSize(maxConfigSize))}
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(src.config))
	if err != nil {
		return nil, invalidImage(err, "image %q has an unreadable config: %v", src.what, err)
	}
	if cfg.OS != "" && cfg.OS != "linux" {
		return nil, errdefs.Unsupported("image %q is a %s image; only linux images can run here", src.what, cfg.OS)
	}
	if cfg.Architecture != "" && cfg.Architecture != runtime.GOARCH {
		s.log.Warn("image is built for another architecture", "image", src.what, "arch", cfg.Architecture, "host", runtime.GOARCH)
	}
	if len(cfg.RootFS.DiffIDs) != len(src.layers) {
		return nil, invalidImage(nil, "image %q is malformed: %d layers but %d diffIDs in its config", src.what, len(src.layers), len(cfg.RootFS.DiffIDs))
	}
	return cfg, nil
}

// writeBlobs stores the image's index, manifest (made for an image that
// came without one) and config, once its layers are in.
func (s *Store) writeBlobs(src *source, in *installed) (err error) {
	if src.manifest == nil {
		if src.manifest, err = s.synthManifest(src.config, in.rec.Layers); err != nil {
			return err
		}
		in.manifest = digestOf(src.manifest)
		s.mu.Lock()
		s.pinLocked(in.manifest)
		s.mu.Unlock()
		in.pins = append(in.pins, in.manifest)
	}
	if in.digest == "" {
		in.digest = in.manifest
	}
	if src.index != nil {
		if err := s.writeBlob(in.digest, src.index); err != nil {
			return err
		}
	}
	if err := s.writeBlob(in.manifest, src.manifest); err != nil {
		return err
	}
	return s.writeBlob(in.rec.Config, src.config)
}

// dropUnused removes what a failed install left that nothing uses: the
// layers it unpacked before it failed (unless another pull has them
// pinned), so that a failed pull or import leaves nothing of its image.
func (s *Store) dropUnused() {
	s.mu.Lock()
	trash, err := s.gcLocked(false)
	s.mu.Unlock()
	removeAll(trash)
	if err != nil {
		s.log.Warn("cannot clean up after a failed install", "err", err)
	}
}

// synthManifest builds a manifest for an image from a docker archive,
// which has none: uncompressed layers, named by diffID. It is
// deterministic, so importing the same archive twice gives one digest,
// and cheap (no recompression just to compute digests).
func (s *Store) synthManifest(config []byte, diffIDs []string) ([]byte, error) {
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.DockerManifestSchema2,
		Config:        v1.Descriptor{MediaType: types.DockerConfigJSON, Size: int64(len(config))},
	}
	var err error
	if m.Config.Digest, err = v1.NewHash(digestOf(config)); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range diffIDs {
		lr := s.idx.Layers[d]
		if lr == nil {
			return nil, fmt.Errorf("layer %s vanished while importing", shortHex(d))
		}
		h, err := v1.NewHash(d)
		if err != nil {
			return nil, err
		}
		m.Layers = append(m.Layers, v1.Descriptor{MediaType: types.DockerUncompressedLayer, Size: lr.TarSize, Digest: h})
	}
	return json.Marshal(m)
}

// commit points references at an installed image. A reference that
// pointed at another image leaves that image reachable by digest
// (repo@sha256:...) rather than dangling: sandboxes may still run on it.
func (s *Store) commit(keys []string, in *installed) ([]*Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now().UTC()
	if old := s.idx.Images[in.manifest]; old != nil && len(in.rec.Blobs) == 0 {
		in.rec.Blobs = old.Blobs // an import's layers, kept when a pull or a copy of the same image comes
	}
	s.idx.Images[in.manifest] = in.rec
	for _, key := range keys {
		created := now
		if old := s.idx.Refs[key]; old != nil {
			if old.Manifest == in.manifest {
				created = old.Created
			} else if dk := digestKey(key, old.Digest); dk != "" && s.idx.Refs[dk] == nil {
				s.idx.Refs[dk] = old
			}
		}
		s.idx.Refs[key] = &refRecord{Digest: in.digest, Manifest: in.manifest, Created: created, Origin: in.origin}
	}
	if err := s.saveLocked(); err != nil {
		return nil, err
	}
	out := make([]*Image, 0, len(keys))
	for _, key := range keys {
		img, err := s.imageLocked(key)
		if err != nil {
			return nil, err
		}
		out = append(out, img)
	}
	return out, nil
}

func configOf(cfg *v1.ConfigFile) Config {
	c := cfg.Config
	return Config{Env: c.Env, Cmd: c.Cmd, Entrypoint: c.Entrypoint, WorkingDir: c.WorkingDir, User: c.User}
}

func digestOf(b []byte) string {
	h := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(h[:])
}
