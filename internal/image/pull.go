package image

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/useshards/shard/internal/errdefs"
)

// Pull fetches ref from its registry (through the mirrors, for Docker Hub)
// and installs it. It always asks the registry what the reference points
// to now; layers already unpacked are reused, not downloaded again.
func (s *Store) Pull(ctx context.Context, ref string, progress func(Progress)) (*Image, error) {
	img, err := s.pull(ctx, ref, progress)
	return img, s.public(err, nil)
}

func (s *Store) pull(ctx context.Context, ref string, progress func(Progress)) (*Image, error) {
	if strings.HasPrefix(strings.TrimSpace(ref), "sha256:") {
		return nil, errdefs.Invalid("cannot pull %q: an image ID is not a reference; give a name such as python:3.12", ref)
	}
	r, err := s.parseRef(ref)
	if err != nil {
		return nil, err
	}
	what := familiar(r)
	rep := &reporter{fn: progress}
	rep.send(Progress{Status: StatusResolving})
	desc, from, err := s.fetch(ctx, r, what)
	if err != nil {
		return nil, err
	}
	registry := from.Context().RegistryStr()
	src, err := remoteSource(desc, what)
	if err != nil {
		return nil, classify(ctx, err, what, registry)
	}
	in, err := s.install(ctx, src, rep)
	if err != nil {
		return nil, classify(ctx, err, what, registry)
	}
	defer s.unpin(in.pins...)
	imgs, err := s.commit([]string{canonical(r)}, in)
	if err != nil {
		return nil, err
	}
	rep.send(Progress{Status: StatusDone})
	s.log.Info("pulled image", "image", what, "digest", in.digest, "from", registry)
	return imgs[0], nil
}

// fetch resolves the reference, trying each mirror in turn for Docker Hub
// images and then the registry itself. Mirror failures are logged; the
// error returned is the registry's own, except that on a machine that cannot
// reach the registry a mirror's "not found" is the better answer (offline,
// a mistyped tag must not read as a network problem).
func (s *Store) fetch(ctx context.Context, r name.Reference, what string) (*remote.Descriptor, name.Reference, error) {
	var tries []name.Reference
	if r.Context().RegistryStr() == name.DefaultRegistry {
		for _, m := range s.mirrors {
			tries = append(tries, m.rebase(r))
		}
	}
	tries = append(tries, r)
	var err, mirrorNotFound error
	for i, t := range tries {
		desc, gerr := remote.Get(t, s.remoteOptions(ctx, t.Context().Registry)...)
		if gerr == nil {
			return desc, t, nil
		}
		err = classify(ctx, gerr, what, t.Context().RegistryStr())
		if ctx.Err() != nil {
			return nil, nil, err
		}
		if i < len(tries)-1 {
			if mirrorNotFound == nil && errdefs.Is(err, errdefs.KindNotFound) {
				mirrorNotFound = err
			}
			s.log.Warn("registry mirror failed, trying the next source", "mirror", t.Context().RegistryStr(), "image", what, "err", gerr)
		}
	}
	if mirrorNotFound != nil && errdefs.Is(err, errdefs.KindUnavailable) {
		return nil, nil, errdefs.NotFound("image_not_found", "%v (and %v)", mirrorNotFound, err)
	}
	return nil, nil, err
}

func (s *Store) remoteOptions(ctx context.Context, reg name.Registry) []remote.Option {
	return []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithTransport(s.transportFor(reg)),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH, Variant: defaultVariant()}),
		remote.WithUserAgent("shard"),
	}
}

// remoteSource turns a registry descriptor into an installable source,
// picking this machine's platform from a multi-arch index.
func remoteSource(desc *remote.Descriptor, what string) (*source, error) {
	src := &source{what: what, digest: desc.Digest.String()}
	var img v1.Image
	var err error
	if desc.MediaType.IsIndex() {
		src.index = desc.Manifest
		idx, ierr := desc.ImageIndex()
		if ierr != nil {
			return nil, ierr
		}
		img, err = imageFromIndex(idx, what, checkDoc)
	} else {
		img, err = desc.Image()
	}
	if err != nil {
		return nil, err
	}
	return imageSource(src, img, checkDoc)
}

// docCheck refuses a document (a manifest, an index, a config) over limit
// before it is read whole: by its descriptor, and for a layout by its file.
type docCheck func(d v1.Descriptor, doc string, limit int64) error

// imageSource fills src from an image whose layers are stored compressed
// (registry, OCI layout).
func imageSource(src *source, img v1.Image, check docCheck) (*source, error) {
	var err error
	if src.manifest, err = img.RawManifest(); err != nil {
		return nil, err
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, err
	}
	if err := check(m.Config, "config", maxConfigSize); err != nil {
		return nil, err
	}
	if src.config, err = img.RawConfigFile(); err != nil {
		return nil, err
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return nil, err
		}
		size, _ := l.Size()
		src.layers = append(src.layers, layerSource{id: shortHex(d.String()), digest: d.String(), size: size, open: l.Compressed})
	}
	return src, nil
}

// imageFromIndex picks the linux/GOARCH image, through nested indexes.
func imageFromIndex(idx v1.ImageIndex, what string, check docCheck) (v1.Image, error) {
	for range 4 {
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, err
		}
		d, err := pickPlatform(im.Manifests, what)
		if err != nil {
			return nil, err
		}
		doc := "manifest"
		if d.MediaType.IsIndex() {
			doc = "index"
		}
		if err := check(d, doc, maxManifestSize); err != nil {
			return nil, err
		}
		if !d.MediaType.IsIndex() {
			return idx.Image(d.Digest)
		}
		if idx, err = idx.ImageIndex(d.Digest); err != nil {
			return nil, err
		}
	}
	return nil, invalidImage(nil, "image %q: its image indexes are nested too deep", what)
}

// pickPlatform chooses linux/GOARCH, preferring the default variant
// (v8 on arm64). Attestation manifests (platform unknown/unknown) are
// skipped; an index whose only image has no platform gives that image.
func pickPlatform(ds []v1.Descriptor, what string) (v1.Descriptor, error) {
	var best *v1.Descriptor
	bestScore := 0
	var seen, unlabeled []string
	var lastUnlabeled v1.Descriptor
	for i, d := range ds {
		if !d.MediaType.IsImage() && !d.MediaType.IsIndex() {
			continue
		}
		p := d.Platform
		if p == nil {
			unlabeled = append(unlabeled, d.Digest.String())
			lastUnlabeled = d
			continue
		}
		if p.OS == "unknown" {
			continue
		}
		seen = append(seen, p.String())
		if p.OS != "linux" || p.Architecture != runtime.GOARCH {
			continue
		}
		score := 1
		if p.Variant == defaultVariant() {
			score = 2
		}
		if score > bestScore {
			best, bestScore = &ds[i], score
		}
	}
	if best != nil {
		return *best, nil
	}
	if len(seen) == 0 && len(unlabeled) == 1 {
		return lastUnlabeled, nil
	}
	return v1.Descriptor{}, errdefs.NotFound("image_not_found", "image %q has no linux/%s variant (it has: %s)",
		what, runtime.GOARCH, strings.Join(seen, ", "))
}

func defaultVariant() string {
	switch runtime.GOARCH {
	case "arm64":
		return "v8"
	case "arm":
		return "v7"
	}
	return ""
}

// classify maps a registry failure to the errdefs class the API reports,
// with a message that says what went wrong in the user's terms.
func classify(ctx context.Context, err error, what, registry string) error {
	if err == nil {
		return nil
	}
	if _, ok := errdefs.As(err); ok {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("pull %q: %w", what, ctx.Err())
	}
	if e, ok := docTooLarge(err, what); ok {
		return e
	}
	cls := func(kind errdefs.Kind, code, format string, args ...any) error {
		return &errdefs.Error{Kind: kind, Code: code, Msg: fmt.Sprintf(format, args...), Err: err}
	}
	var te *transport.Error
	if errors.As(err, &te) {
		switch {
		case hasCode(te, transport.BlobUnknownErrorCode):
			return cls(errdefs.KindUnavailable, "registry_unreachable", "registry %s is missing layer data of image %q", registry, what)
		case te.StatusCode == http.StatusNotFound || hasCode(te, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode):
			return cls(errdefs.KindNotFound, "image_not_found", "image %q not found in registry %s", what, registry)
		case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden ||
			hasCode(te, transport.UnauthorizedErrorCode, transport.DeniedErrorCode):
			return cls(errdefs.KindForbidden, "registry_denied",
				"registry %s denied access to image %q: the repository may not exist, or it needs credentials (docker login %s)", registry, what, registry)
		case te.StatusCode == http.StatusTooManyRequests || hasCode(te, transport.TooManyRequestsErrorCode):
			return cls(errdefs.KindUnavailable, "registry_unreachable", "registry %s is rate-limiting pulls of %q; try again later", registry, what)
		case te.StatusCode >= 500:
			return cls(errdefs.KindUnavailable, "registry_unreachable", "registry %s failed while pulling %q: %v", registry, what, err)
		}
		return cls(errdefs.KindUnavailable, "registry_unreachable", "registry %s failed while pulling %q: %v", registry, what, err)
	}
	if isNetworkError(err) {
		return cls(errdefs.KindUnavailable, "registry_unreachable", "cannot reach registry %s to pull %q: %v", registry, what, err)
	}
	// What is left is what the registry sent: a manifest, index or config
	// that does not parse or verify, a layer whose blob does not match its
	// digest. The store's own failures are classified where they happen.
	return cls(errdefs.KindFailed, codeInvalidImage, "image %q from registry %s is not a valid image: %v", what, registry, err)
}

func hasCode(te *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range te.Errors {
		for _, c := range codes {
			if d.Code == c {
				return true
			}
		}
	}
	return false
}

func isNetworkError(err error) bool {
	var (
		ue  *url.Error
		oe  *net.OpError
		de  *net.DNSError
		ne  net.Error
		cve *tls.CertificateVerificationError
		rhe tls.RecordHeaderError
	)
	// A bare errno is a net.Error too (it has Timeout and Temporary): one
	// from unpacking on the local disk is not the registry's.
	if errors.As(err, &ne) {
		if _, errno := ne.(syscall.Errno); !errno {
			return true
		}
	}
	return errors.As(err, &ue) || errors.As(err, &oe) || errors.As(err, &de) ||
		errors.As(err, &cve) || errors.As(err, &rhe) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}
