// Package image keeps a content-addressed image cache under a directory and
// unpacks each layer exactly once into a read-only directory that many
// sandboxes share as overlayfs lowerdirs.
//
// Layout of Options.Dir:
//
//	index.json          refs, images and layers (rewritten atomically)
//	blobs/sha256/<hex>  manifests, indexes and configs, by digest
//	l/<16 hex>          one unpacked layer, named by its diffID; short on purpose:
//	                    overlayfs mount options must fit in one page
//	tmp/                layers being unpacked, uploads and archives being
//	                    imported, dirs being deleted; emptied by Open
//
// Compressed layers are never kept: they are streamed from the registry
// straight into the unpacker, and their digests are checked on the way.
// What an image (or an upload) may take of the host's disk and memory is
// bounded as it is read: see limits.go.
//
// Only root may enter Dir and the dirs above (0700, also made so by Open
// in a cache an older version made looser): the layer trees keep their
// images' setuid binaries and file capabilities, which sandboxes need
// (/bin/su), and no host user may run those. Device nodes are not created
// at all: see Device.
//
// One process owns a Dir at a time; within it, a Store is safe for
// concurrent use.
package image

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/hostdir"
	"github.com/useshards/shard/internal/hostdisk"
	"github.com/useshards/shard/internal/metrics"
	"github.com/useshards/shard/internal/project"
)

// Options configures a Store.
type Options struct {
	Dir      string   // root of the cache, e.g. /var/lib/shard/images
	Mirrors  []string // Docker Hub mirrors tried in order before docker.io; "http://" means plain HTTP
	Insecure []string // registry hosts (host:port) reachable over plain HTTP or without TLS verification
	// Allowed are registries (host[:port]) a pull may name besides the
	// mirrors and Insecure ones; when set, the only ones. Like those,
	// they may be on private or loopback addresses (see guard.go).
	Allowed []string
	// Blocked are networks of this host a pull never reaches unless the
	// registry is listed: the sandbox subnet.
	Blocked []netip.Prefix
	// PullTimeout bounds one pull, from the first request to the last
	// layer unpacked. 0 is DefaultPullTimeout.
	PullTimeout time.Duration
	Logger      *slog.Logger
	// MaxImageSize bounds one image: what its layers decompress to, and
	// their files (sparse ones at full size), and an import's upload (see
	// limits.go). 0 is DefaultMaxImageSize.
	MaxImageSize int64
	Metrics      *metrics.Metrics // nil: pulls not counted
	// Disk is the host filesystem's budget the store writes within (nil:
	// Dir's filesystem, keeping hostdisk.DefaultReserve free).
	Disk *hostdisk.Budget
}

// Config is the part of an image's configuration that runs a container.
type Config struct {
	Env        []string `json:"env,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	WorkingDir string   `json:"workingDir,omitempty"`
	User       string   `json:"user,omitempty"`
}

// Image is a locally available image, as one reference to it.
type Image struct {
	Ref     string    `json:"ref"`     // full reference, e.g. "docker.io/library/python:3.12-slim"
	Project string    `json:"project"` // the project of an import (localhost/...); "" for a pulled image, which every project shares
	Name    string    `json:"name"`    // familiar name, e.g. "python:3.12-slim"
	Digest  string    `json:"digest"`  // digest the reference resolved to (the index's, for multi-arch images)
	ID      string    `json:"id"`      // config digest: the same image has the same ID under any name
	Size    int64     `json:"size"`    // bytes of file content in the unpacked layers
	Layers  []string  `json:"layers"`  // absolute unpacked layer dirs, bottom first
	Config  Config    `json:"config"`  // how to run it
	Created time.Time `json:"created"` // when it was pulled or imported here
	// Origin is the node of a cluster this import is a copy of ("": made
	// here).
	Origin string `json:"origin,omitempty"`
	// Devices are the image's device nodes, which are not in Layers: the
	// runtime makes them inside the sandbox (oci.Options.Devices).
	Devices []specs.LinuxDevice `json:"devices,omitempty"`
}

// Store is the image cache. Create it with Open.
type Store struct {
	dir      string
	log      *slog.Logger
	mirrors  []mirror
	insecure map[string]bool
	guard    *guard
	pullTime time.Duration    // Options.PullTimeout
	maxImage int64            // Options.MaxImageSize
	disk     *hostdisk.Budget // Options.Disk
	reg      Registry         // a cluster told of imports made and removed here; nil on a single host

	mu   sync.Mutex // guards idx and pins, and serializes index.json writes
	idx  *index
	pins map[string]int // digests/diffIDs in use by in-flight pulls: GC keeps them

	metrics    *metrics.Metrics
	layerLocks keyedMutex // one unpack per diffID at a time
	refLocks   keyedMutex // one Ensure-triggered pull per reference at a time
}

// Open opens (creating if needed) the cache in opts.Dir, removes leftovers
// of interrupted work, and garbage-collects anything no reference uses.
func Open(opts Options) (*Store, error) {
	if opts.Dir == "" {
		return nil, errdefs.Invalid("image store directory is not set")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	s := &Store{
		dir:      dir,
		log:      opts.Logger,
		insecure: map[string]bool{},
		pins:     map[string]int{},
		maxImage: opts.MaxImageSize,
		pullTime: opts.PullTimeout,
		disk:     opts.Disk,
		guard:    newGuard(),
		metrics:  opts.Metrics,
	}
	if s.disk == nil {
		s.disk = hostdisk.New(dir, 0)
	}
	if s.pullTime < 0 {
		return nil, errdefs.Invalid("the pull timeout must not be negative")
	}
	if s.pullTime == 0 {
		s.pullTime = DefaultPullTimeout
	}
	if s.maxImage < 0 {
		return nil, errdefs.Invalid("the largest image size must not be negative")
	}
	if s.maxImage == 0 {
		s.maxImage = DefaultMaxImageSize
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if err := s.registries(opts); err != nil {
		return nil, err
	}
	for _, d := range []string{dir, s.path("l"), s.path("blobs"), s.path("blobs", "sha256"), s.path("tmp")} {
		if err := hostdir.Private(d); err != nil {
			return nil, err
		}
	}
	// Uploads spooled, layers half unpacked, dirs half deleted when the
	// last server stopped.
	if err := clearDir(s.path("tmp")); err != nil {
		return nil, err
	}
	if s.idx, err = loadIndex(s.path(indexFile)); err != nil {
		return nil, err
	}
	s.mu.Lock()
	trash, err := s.gcLocked(false)
	if err == nil {
		var more []string
		more, err = s.upgradeLayersLocked()
		trash = append(trash, more...)
	}
	s.mu.Unlock()
	removeAll(trash)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// registries reads the options that say which registries pulls reach and
// how: insecure, allowed, mirrors, and the addresses blocked.
func (s *Store) registries(opts Options) error {
	g := s.guard
	for _, h := range opts.Insecure {
		if h = normalizeHost(h); h != "" {
			s.insecure[h] = true
			g.insecure[strings.ToLower(h)], g.listed[strings.ToLower(h)] = true, true
		}
	}
	for _, h := range opts.Allowed {
		if h = normalizeHost(h); h != "" {
			g.allowed[strings.ToLower(h)], g.listed[strings.ToLower(h)] = true, true
			g.only = true
		}
	}
	for _, raw := range opts.Mirrors {
		m, err := parseMirror(raw, s.insecure)
		if err != nil {
			return err
		}
		s.mirrors = append(s.mirrors, m)
		h := strings.ToLower(m.reg.RegistryStr())
		g.listed[h] = true
		if m.reg.Scheme() == "http" {
			g.insecure[h] = true
		}
	}
	g.blocked = opts.Blocked
	g.hubViaMirror = len(s.mirrors) > 0
	return nil
}

// upgradeLayersLocked converts layer dirs unpacked by an older version:
// their device nodes are recorded and removed (scrubLayerDir). A layer that
// cannot be converted is dropped, to be unpacked again by the next pull.
// It returns dirs to delete.
func (s *Store) upgradeLayersLocked() ([]string, error) {
	var trash []string
	changed := false
	for diffID, lr := range s.idx.Layers {
		if lr.Format >= layerFormat {
			continue
		}
		changed = true
		devs, err := scrubLayerDir(s.path("l", lr.Dir))
		if err != nil {
			s.log.Warn("cannot convert a layer unpacked by an older version: dropping it", "layer", diffID, "err", err)
			delete(s.idx.Layers, diffID)
			if t := s.trashLocked(s.path("l", lr.Dir)); t != "" {
				trash = append(trash, t)
			}
			continue
		}
		if len(devs) > 0 {
			s.log.Info("device nodes moved out of a layer dir into the index", "layer", diffID, "devices", len(devs))
		}
		lr.Format, lr.Devices = layerFormat, devs
	}
	if !changed {
		return trash, nil
	}
	return trash, s.saveLocked()
}

// MaxImageSize is the bound of one image and of an import's upload
// (Options.MaxImageSize).
func (s *Store) MaxImageSize() int64 { return s.maxImage }

// Dir is the cache's root directory (`shard df` measures it).
func (s *Store) Dir() string { return s.dir }

func (s *Store) path(elem ...string) string {
	return filepath.Join(append([]string{s.dir}, elem...)...)
}

// Get returns a cached image without contacting any registry. ref may be a
// familiar name, a full reference, or an ID/digest (or a prefix of at least
// 12 hex digits of one). It fails with not_found/image_not_found otherwise.
func (s *Store) Get(ctx context.Context, ref string) (*Image, error) {
	if err := project.Require(ctx); err != nil { // an import is found in ctx's project
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	keys, err := s.resolveLocked(ctx, ref)
	if err != nil {
		return nil, err
	}
	return s.imageLocked(keys[0])
}

// Ensure returns the cached image, pulling it if it is not cached.
func (s *Store) Ensure(ctx context.Context, ref string, progress func(Progress)) (*Image, error) {
	img, err := s.Get(ctx, ref)
	if err == nil || !errdefs.Is(err, errdefs.KindNotFound) {
		return img, err
	}
	if strings.HasPrefix(ref, "sha256:") {
		return nil, err // an ID cannot be pulled
	}
	if r, perr := s.parseRef(ref); perr == nil && isLocal(r) {
		return nil, err // an import is not pulled
	}
	// Concurrent Ensures of one reference share a single pull.
	unlock, lerr := s.refLocks.lock(ctx, strings.TrimSpace(ref))
	if lerr != nil {
		return nil, lerr
	}
	defer unlock()
	if img, err := s.Get(ctx, ref); err == nil {
		return img, nil
	}
	return s.Pull(ctx, ref, progress)
}

// List returns every reference ctx may see, sorted by name: the pulled
// images and ctx's project's imports (every project's, unscoped).
func (s *Store) List(ctx context.Context) ([]*Image, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Image, 0, len(s.idx.Refs))
	for key := range s.idx.Refs {
		if !visible(ctx, key) {
			continue
		}
		img, err := s.imageLocked(key)
		if err != nil {
			s.log.Warn("image is incomplete on disk", "ref", key, "err", err)
			continue
		}
		out = append(out, img)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Project < out[j].Project
	})
	return out, nil
}

// Remove deletes a reference (all references ctx sees, when given an ID or
// digest) and frees the layers and blobs no remaining reference uses. A
// pulled image is shared by every project: unless shared is set (an admin
// asks), removing one is refused (403 image_shared). The caller makes sure
// no sandbox still uses the image.
func (s *Store) Remove(ctx context.Context, ref string, shared bool) error {
	if err := project.Require(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	keys, err := s.resolveLocked(ctx, ref)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	if !shared {
		for _, k := range keys {
			if p, canon := splitKey(k); p == "" {
				s.mu.Unlock()
				return errdefs.New(errdefs.KindForbidden, client.CodeImageShared,
					"cannot remove image %q: it was pulled from a registry and every project shares it; only an admin key may remove it", familiarOf(canon))
			}
		}
	}
	var released []string
	for _, k := range keys {
		if p, _ := splitKey(k); p != "" && s.idx.Refs[k].Origin == "" {
			released = append(released, k)
		}
		delete(s.idx.Refs, k)
	}
	trash, err := s.gcLocked(true)
	s.mu.Unlock()
	removeAll(trash)
	if err == nil && s.reg != nil {
		for _, k := range released {
			p, canon := splitKey(k)
			s.reg.ReleaseImport(context.WithoutCancel(ctx), p, canon)
		}
	}
	return err
}

// resolveLocked finds the index keys a user's reference means: one key for
// a name, every key of the image for an ID or digest.
// Only keys ctx may see are found; a localhost/ name is looked up among
// the imports of ctx's project only, any other name among pulled images
// only.
func (s *Store) resolveLocked(ctx context.Context, ref string) ([]string, error) {
	ref = strings.TrimSpace(ref)
	if idPattern.MatchString(ref) {
		keys, err := s.byIDLocked(ctx, ref)
		if err != nil || len(keys) > 0 {
			return keys, err
		}
		if strings.HasPrefix(ref, "sha256:") {
			return nil, errdefs.NotFound(client.CodeImageNotFound, "no local image has ID or digest %q", ref)
		}
		// A bare hex string may also be a repository name: fall through.
	}
	r, err := s.parseRef(ref)
	if err != nil {
		return nil, err
	}
	key, proj := canonical(r), ""
	if isLocal(r) {
		proj = project.Of(ctx)
		key = importKey(proj, key)
	}
	if _, ok := s.idx.Refs[key]; ok {
		return []string{key}, nil
	}
	if _, isDigest := r.(name.Digest); isDigest {
		// repo@digest also finds the image pulled by tag from that repository.
		repo := registryName(r) + "/" + r.Context().RepositoryStr()
		var keys []string
		for k, rr := range s.idx.Refs {
			p, canon := splitKey(k)
			if p == proj && refRepo(canon) == repo && (rr.Digest == r.Identifier() || rr.Manifest == r.Identifier()) {
				keys = append(keys, k)
			}
		}
		if len(keys) > 0 {
			sort.Strings(keys)
			return keys, nil
		}
	}
	if proj != "" {
		return nil, errdefs.NotFound(client.CodeImageNotFound, "image %q not found in project %s: an image under localhost/ is one this project imported (shard image import)", familiar(r), proj)
	}
	return nil, errdefs.NotFound(client.CodeImageNotFound, "image %q not found locally", familiar(r))
}

// byIDLocked matches an ID/digest prefix against the digests refs resolved
// to, the manifests, and the config digests (IDs). Tag keys sort first so
// that Get presents an image by its tag rather than its digest.
func (s *Store) byIDLocked(ctx context.Context, id string) ([]string, error) {
	hex := strings.TrimPrefix(id, "sha256:")
	match := func(d string) bool { return strings.HasPrefix(strings.TrimPrefix(d, "sha256:"), hex) }
	manifests := map[string]bool{}
	var keys []string
	for k, rr := range s.idx.Refs {
		if !visible(ctx, k) {
			continue
		}
		im := s.idx.Images[rr.Manifest]
		if match(rr.Digest) || match(rr.Manifest) || (im != nil && match(im.Config)) {
			manifests[rr.Manifest] = true
			keys = append(keys, k)
		}
	}
	if len(manifests) > 1 {
		return nil, errdefs.Invalid("image ID %q is ambiguous: it matches %d images; give more digits", id, len(manifests))
	}
	sort.Slice(keys, func(i, j int) bool {
		di, dj := strings.Contains(keys[i], "@"), strings.Contains(keys[j], "@")
		if di != dj {
			return !di
		}
		return keys[i] < keys[j]
	})
	return keys, nil
}

// refRepo strips the tag or digest from a canonical key.
func refRepo(key string) string {
	if i := strings.LastIndex(key, "@"); i >= 0 {
		return key[:i]
	}
	if i := strings.LastIndex(key, ":"); i > strings.LastIndex(key, "/") {
		return key[:i]
	}
	return key
}

// imageLocked builds the Image for an index key. Its layer dirs must all
// exist; a missing one (deleted behind our back) makes the image not found
// so that Ensure pulls it again.
func (s *Store) imageLocked(key string) (*Image, error) {
	rr := s.idx.Refs[key]
	if rr == nil {
		return nil, errdefs.NotFound(client.CodeImageNotFound, "image %q not found locally", familiarOf(key))
	}
	im := s.idx.Images[rr.Manifest]
	if im == nil {
		return nil, errdefs.NotFound(client.CodeImageNotFound, "image %q is incomplete locally; pull it again", familiarOf(key))
	}
	proj, canon := splitKey(key)
	img := &Image{
		Ref:     canon,
		Project: proj,
		Name:    familiarOf(key),
		Digest:  rr.Digest,
		ID:      im.Config,
		Config:  im.Spec,
		Created: rr.Created,
		Origin:  rr.Origin,
	}
	seen := map[string]bool{}
	var recs []*layerRecord
	for i, diffID := range im.Layers {
		lr := s.idx.Layers[diffID]
		if lr == nil {
			return nil, errdefs.NotFound(client.CodeImageNotFound, "image %q is missing layer %s locally; pull it again", img.Name, shortHex(diffID))
		}
		if _, err := os.Lstat(s.path("l", lr.Dir)); err != nil {
			return nil, errdefs.NotFound(client.CodeImageNotFound, "image %q is missing layer %s on disk; pull it again", img.Name, shortHex(diffID))
		}
		if !seen[diffID] {
			img.Size += lr.Size
		}
		seen[diffID] = true
		// A layer repeated higher in the stack makes its lower copies
		// redundant (the upper copy re-adds and re-hides the same paths),
		// and overlayfs may refuse one dir twice: keep the topmost only.
		if !containsAfter(im.Layers, i, diffID) {
			img.Layers = append(img.Layers, s.path("l", lr.Dir))
			recs = append(recs, lr)
		}
	}
	img.Devices = imageDevices(recs, img.Layers)
	return img, nil
}

// Devices returns the device nodes of a cached image (Image.Devices), for
// the sandbox's runtime to make; nil if it has none or is not cached.
func (s *Store) Devices(ref string) []specs.LinuxDevice {
	if s == nil {
		return nil
	}
	img, err := s.Get(project.Unscoped(context.Background(), "a sandbox's image's devices, by digest in any project"), ref)
	if err != nil {
		return nil
	}
	return img.Devices
}

func containsAfter(list []string, i int, v string) bool {
	for _, x := range list[i+1:] {
		if x == v {
			return true
		}
	}
	return false
}

// shortHex is the first 12 hex digits of a digest, as docker shows IDs.
func shortHex(digest string) string {
	h := strings.TrimPrefix(digest, "sha256:")
	if len(h) > 12 {
		h = h[:12]
	}
	return h
}

func (s *Store) pinLocked(keys ...string) {
	for _, k := range keys {
		if k != "" {
			s.pins[k]++
		}
	}
}

func (s *Store) unpin(keys ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		if k == "" {
			continue
		}
		if s.pins[k]--; s.pins[k] <= 0 {
			delete(s.pins, k)
		}
	}
}

func removeAll(paths []string) {
	for _, p := range paths {
		_ = os.RemoveAll(p)
	}
}

func clearDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the connections to registries left idle by pulls.
func (s *Store) Close() { s.guard.closeIdle() }
